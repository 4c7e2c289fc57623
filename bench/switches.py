#!/usr/bin/env python3
"""End-to-end speed of the ladder's fp32 switches on this CPU: flash vs eager attention and fused
vs unfused kernels, for llama-small and opt-small, measured as training tokens/s (issue 3: flash
must not be slower than eager at seq-len 1024; fused kernels not slower than unfused).

Configurations alternate within each round so that both sides of a comparison see the same
machine load; the best of the rounds is reported (load only ever slows a run down).

    python3 bench/switches.py [--build build] [--models llama-small,opt-small] [--seq-len 1024]
                              [--micro-batch-size 2] [--steps 4] [--rounds 3] [--threads 2]
"""
import argparse, json, os, subprocess, tempfile

CONFIGS = [
    ("eager", []),
    ("flash", ["--attn", "flash"]),
    ("eager + fused", ["--fused-kernels"]),
    ("flash + fused", ["--attn", "flash", "--fused-kernels"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default="llama-small,opt-small")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    exe = os.path.join(a.build, "scalelab")
    for model in a.models.split(","):
        best = {name: 0.0 for name, _ in CONFIGS}
        mem = {}
        for _ in range(a.rounds):
            for name, flags in CONFIGS:
                with tempfile.TemporaryDirectory() as td:
                    rec = os.path.join(td, "r.json")
                    subprocess.run([exe, "train", "--model", model, "--seq-len", str(a.seq_len), "--micro-batch-size",
                                    str(a.micro_batch_size), "--max-steps", str(a.steps), "--bench-warmup-steps", "1",
                                    "--threads", str(a.threads), "--quiet", "--json", rec] + flags,
                                   check=True, capture_output=True)
                    j = json.load(open(rec))
                    best[name] = max(best[name], j["tokens_per_s_per_device"])
                    mem[name] = j["max_reserved_bytes"]
        print(f"\n{model}, seq-len {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, {a.threads} threads, "
              f"best of {a.rounds} rounds ({a.steps} steps, 1 warm-up)")
        print(f"{'configuration':<16} {'tokens/s':>10} {'reserved GiB':>13}")
        for name, _ in CONFIGS:
            print(f"{name:<16} {best[name]:>10.1f} {mem[name] / 2**30:>13.2f}")
        print(f"flash / eager:            {best['flash'] / best['eager']:.3f}x (target >= 1)")
        print(f"fused / unfused (eager):  {best['eager + fused'] / best['eager']:.3f}x (target >= 1)")
        print(f"fused / unfused (flash):  {best['flash + fused'] / best['flash']:.3f}x (target >= 1)")


if __name__ == "__main__":
    main()
