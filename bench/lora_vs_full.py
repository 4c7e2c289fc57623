#!/usr/bin/env python3
"""LoRA vs full fine-tuning with the same trainer, side by side: median step time, tokens/s, peak
reserved memory (measured) and the plan's weights / gradients / optimizer states, arms alternating
round by round (the VM is shared; read the per-round ratios). Uses python3 only.

  python3 bench/lora_vs_full.py --build build [--model llama-small] [--rounds 3]
"""
import argparse
import statistics

from scalelab_run import run, part

ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="llama-small")
    ap.add_argument("--seq-len", default="256")
    ap.add_argument("--micro-batch-size", default="4")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--steps", default="6")
    ap.add_argument("--rank", default="8")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    common = ["--model", a.model, "--seq-len", a.seq_len, "--micro-batch-size", a.micro_batch_size, "--threads",
              a.threads, "--max-steps", a.steps, "--bench-warmup-steps", "2"]
    arms = {"full": [], "lora": ["--lora-rank", a.rank, "--lora-alpha", str(2 * int(a.rank)), "--lora-targets", ALL]}
    res = {k: [] for k in arms}
    for rnd in range(a.rounds):
        for name, extra in (arms.items() if rnd % 2 == 0 else reversed(list(arms.items()))):
            res[name].append(run(a.build, extra, common))
        f, l = res["full"][-1]["step_time_s"], res["lora"][-1]["step_time_s"]
        print(f"round {rnd + 1}: full {f:.3f} s/step, lora {l:.3f} s/step, lora/full {l / f:.3f}")
    gib = 1 << 30
    # Every measured step of every round, per arm: the VM's neighbours slow steps down (never up), so
    # besides the medians the fastest step of each arm is printed too.
    steps = {k: [t for r in v for t in r["step_times_s"][-r["measured_steps"]:]] for k, v in res.items()}
    rounds = [l["step_time_s"] / f["step_time_s"] for f, l in zip(res["full"], res["lora"])]
    print(f"\n{a.model}, seq {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, {a.threads} threads, "
          f"LoRA r {a.rank} on {ALL}")
    print(f"lora/full: median of the {len(rounds)} rounds' ratios {statistics.median(rounds):.3f}; "
          f"all {len(steps['full'])} + {len(steps['lora'])} measured steps: median {statistics.median(steps['lora']):.3f} / "
          f"{statistics.median(steps['full']):.3f} s = {statistics.median(steps['lora']) / statistics.median(steps['full']):.3f}, "
          f"fastest {min(steps['lora']):.3f} / {min(steps['full']):.3f} s = {min(steps['lora']) / min(steps['full']):.3f}")
    print(f"{'':28}{'full':>14}{'lora':>14}{'lora/full':>11}")
    rows = []
    for key, label in (("step_time_s", "median step time (s)"), ("tokens_per_s", "tokens/s")):
        f = statistics.median(r[key] for r in res["full"])
        l = statistics.median(r[key] for r in res["lora"])
        rows.append((label, f, l))
    f0, l0 = res["full"][0], res["lora"][0]
    rows.append(("trainable parameters", f0["trainable_params"], l0["trainable_params"]))
    rows.append(("peak reserved, measured GiB", f0["max_reserved_bytes"] / gib, l0["max_reserved_bytes"] / gib))
    rows.append(("peak reserved, plan GiB", f0["memory_plan"]["total_bytes"] / gib, l0["memory_plan"]["total_bytes"] / gib))
    wgo = lambda r: (part(r, "weights") + part(r, "gradients") + part(r, "optimizer states")) / gib
    rows.append(("weights+grads+optim GiB", wgo(f0), wgo(l0)))
    for label, f, l in rows:
        print(f"{label:28}{f:>14.4g}{l:>14.4g}{l / f:>11.3f}")


if __name__ == "__main__":
    main()
