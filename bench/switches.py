#!/usr/bin/env python3
"""End-to-end speed of the ladder's fp32 switches on this CPU: flash vs eager attention and fused
vs unfused kernels, for llama-small and opt-small, measured as training tokens/s (issue 3: flash
must not be slower than eager at seq-len 1024; fused kernels not slower than unfused).

Configurations alternate within each round so that both sides of a comparison see the same
machine load; it reports the best of the rounds (load only ever slows a run down), the median of
the per-round ratios with their range, and the time per step of each op family (from --profile),
so that the switched ops' own time is visible apart from the GEMM noise around them.

    python3 bench/switches.py [--build build] [--models llama-small,opt-small] [--seq-len 1024]
                              [--micro-batch-size 2] [--steps 4] [--rounds 3] [--threads 2]
"""
import argparse, json, os, statistics, subprocess, tempfile

CONFIGS = [
    ("eager", []),
    ("flash", ["--attn", "flash"]),
    ("eager + fused", ["--fused-kernels"]),
    ("flash + fused", ["--attn", "flash", "--fused-kernels"]),
]


def family_seconds(record, steps):
    """Seconds per measured step by op family (forward and backward summed), from --profile."""
    out = {}
    for row in record.get("profile", {}).get("rows", []):
        out[row["family"]] = out.get(row["family"], 0.0) + row["seconds"] / steps
    return out


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
    measured = a.steps - 1
    for model in a.models.split(","):
        runs = {name: [] for name, _ in CONFIGS}  # per round: (tokens/s, family seconds per step)
        mem = {}
        for _ in range(a.rounds):
            for name, flags in CONFIGS:
                with tempfile.TemporaryDirectory() as td:
                    rec = os.path.join(td, "r.json")
                    subprocess.run([exe, "train", "--model", model, "--seq-len", str(a.seq_len), "--micro-batch-size",
                                    str(a.micro_batch_size), "--max-steps", str(a.steps), "--bench-warmup-steps", "1",
                                    "--threads", str(a.threads), "--profile", "--quiet", "--json", rec] + flags,
                                   check=True, capture_output=True)
                    j = json.load(open(rec))
                    runs[name].append((j["tokens_per_s_per_device"], family_seconds(j, measured)))
                    mem[name] = j["max_reserved_bytes"]
        best = {name: max(t for t, _ in runs[name]) for name in runs}
        print(f"\n{model}, seq-len {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, {a.threads} threads, "
              f"{a.rounds} rounds of {a.steps} steps (1 warm-up), configurations alternating within a round")
        families = sorted({f for name in runs for _, fam in runs[name] for f in fam},
                          key=lambda f: -statistics.median(runs["eager"][i][1].get(f, 0) for i in range(a.rounds)))
        families = [f for f in families if any(statistics.median(r[1].get(f, 0) for r in runs[n]) >= 0.01 for n in runs)]
        print(f"{'configuration':<16} {'best tok/s':>10} {'median tok/s':>12} {'reserved GiB':>13}  "
              + " ".join(f"{f + ' s/step':>18}" for f in families))
        for name, _ in CONFIGS:
            med = statistics.median(t for t, _ in runs[name])
            fam = " ".join(f"{statistics.median(r[1].get(f, 0) for r in runs[name]):>18.3f}" for f in families)
            print(f"{name:<16} {best[name]:>10.1f} {med:>12.1f} {mem[name] / 2**30:>13.2f}  {fam}")

        def ratios(num, den):
            r = [runs[num][i][0] / runs[den][i][0] for i in range(a.rounds)]
            return f"best-of {best[num] / best[den]:.3f}x, per-round median {statistics.median(r):.3f}x " \
                   f"(range {min(r):.3f}-{max(r):.3f})"

        def attn(name):
            return statistics.median(r[1].get("attention", 0) for r in runs[name])

        print(f"flash / eager tokens/s:            {ratios('flash', 'eager')} (target >= 1)")
        print(f"  attention op time eager / flash: {attn('eager') / attn('flash'):.3f}x "
              f"({attn('eager'):.3f} vs {attn('flash'):.3f} s/step)")
        print(f"fused / unfused tokens/s (eager):  {ratios('eager + fused', 'eager')} (target >= 1)")
        print(f"fused / unfused tokens/s (flash):  {ratios('flash + fused', 'flash')} (target >= 1)")


if __name__ == "__main__":
    main()
