#!/usr/bin/env python3
"""QLoRA (NF4 base) vs LoRA (fp32 base) with the same trainer, side by side: median step time,
tokens/s, peak reserved memory (measured and planned) and the plan's weights, arms alternating round
by round (the VM is shared; read the per-round ratios). Uses python3 only.

  python3 bench/qlora_vs_lora.py --build build [--model llama-small] [--rounds 3] [--flavor nf4]
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
    ap.add_argument("--flavor", default="nf4", choices=["nf4", "nf4-bnb"])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    common = ["--model", a.model, "--seq-len", a.seq_len, "--micro-batch-size", a.micro_batch_size, "--threads",
              a.threads, "--max-steps", a.steps, "--bench-warmup-steps", "2", "--lora-rank", a.rank, "--lora-alpha",
              str(2 * int(a.rank)), "--lora-targets", ALL]
    arms = {"lora": [], "qlora": ["--quantize-base", a.flavor]}
    res = {k: [] for k in arms}
    for rnd in range(a.rounds):
        for name, extra in (arms.items() if rnd % 2 == 0 else reversed(list(arms.items()))):
            res[name].append(run(a.build, extra, common))
        l, q = res["lora"][-1]["step_time_s"], res["qlora"][-1]["step_time_s"]
        print(f"round {rnd + 1}: lora {l:.3f} s/step, qlora {q:.3f} s/step, qlora/lora {q / l:.3f}")
    gib = 1 << 30
    print(f"\n{a.model}, seq {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, {a.threads} threads, "
          f"r {a.rank} on {ALL}; QLoRA base {a.flavor}")
    print(f"{'':30}{'lora':>14}{'qlora':>14}{'qlora/lora':>12}")
    rows = []
    for key, label in (("step_time_s", "median step time (s)"), ("tokens_per_s", "tokens/s")):
        l = statistics.median(r[key] for r in res["lora"])
        q = statistics.median(r[key] for r in res["qlora"])
        rows.append((label, l, q))
    l0, q0 = res["lora"][0], res["qlora"][0]
    rows.append(("peak reserved, measured GiB", l0["max_reserved_bytes"] / gib, q0["max_reserved_bytes"] / gib))
    rows.append(("peak reserved, plan GiB", l0["memory_plan"]["total_bytes"] / gib, q0["memory_plan"]["total_bytes"] / gib))
    rows.append(("weights (plan) GiB", part(l0, "weights") / gib, part(q0, "weights") / gib))
    rows.append(("workspace (plan) MiB", part(l0, "workspace") / 2**20, part(q0, "workspace") / 2**20))
    for label, l, q in rows:
        print(f"{label:30}{l:>14.4g}{q:>14.4g}{q / l if l else float('nan'):>12.3f}")


if __name__ == "__main__":
    main()
