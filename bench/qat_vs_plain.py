#!/usr/bin/env python3
"""QAT (--qat 8da4w) vs plain full fine-tuning with the same trainer, side by side: median step time,
tokens/s, peak reserved memory (measured and planned), arms alternating round by round (the VM is
shared; read the per-round ratios), and the time QAT's fake quantization takes (--profile: the
"qat" op family). Uses python3 only.

  python3 bench/qat_vs_plain.py --build build [--model llama-small] [--group-size 32] [--rounds 3]
  python3 bench/qat_vs_plain.py --build build --lora-rank 8   # QAT + LoRA vs LoRA (r 8, all 7 projections)
"""
import argparse
import statistics

from scalelab_run import run


def qat_seconds(r):
    rows = (r.get("profile") or {}).get("rows", [])
    return sum(x["seconds"] for x in rows if x["family"] == "qat")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="llama-small")
    ap.add_argument("--seq-len", default="256")
    ap.add_argument("--micro-batch-size", default="4")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--steps", default="6")
    ap.add_argument("--group-size", default="32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lora-rank", default="0", help="> 0: both arms train LoRA adapters (QAT + LoRA vs LoRA)")
    a = ap.parse_args()
    common = ["--model", a.model, "--seq-len", a.seq_len, "--micro-batch-size", a.micro_batch_size, "--threads",
              a.threads, "--max-steps", a.steps, "--bench-warmup-steps", "2", "--profile"]
    lora = int(a.lora_rank) > 0
    if lora:
        common += ["--lora-rank", a.lora_rank, "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]
    arms = {"plain": [], "qat": ["--qat", "8da4w", "--qat-group-size", a.group_size]}
    res = {k: [] for k in arms}
    for rnd in range(a.rounds):
        for name, extra in (arms.items() if rnd % 2 == 0 else reversed(list(arms.items()))):
            res[name].append(run(a.build, extra, common))
        p, q = res["plain"][-1]["step_time_s"], res["qat"][-1]["step_time_s"]
        print(f"round {rnd + 1}: plain {p:.3f} s/step, qat {q:.3f} s/step, qat/plain {q / p:.3f}")
    gib = 1 << 30
    print(f"\n{a.model}, seq {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, {a.threads} threads, "
          f"QAT 8da4w group {a.group_size} on every decoder linear module"
          + (f"; both arms LoRA r {a.lora_rank} on all 7 projections (plain = LoRA, qat = QAT + LoRA)" if lora else ""))
    print(f"{'':30}{'plain':>12}{'qat':>12}{'qat/plain':>11}")
    rows = []
    for key, label in (("step_time_s", "median step time (s)"), ("tokens_per_s", "tokens/s")):
        p = statistics.median(r[key] for r in res["plain"])
        q = statistics.median(r[key] for r in res["qat"])
        rows.append((label, p, q))
    p0, q0 = res["plain"][0], res["qat"][0]
    rows.append(("peak reserved, measured GiB", p0["max_reserved_bytes"] / gib, q0["max_reserved_bytes"] / gib))
    rows.append(("peak reserved, plan GiB", p0["memory_plan"]["total_bytes"] / gib,
                 q0["memory_plan"]["total_bytes"] / gib))
    for label, p, q in rows:
        print(f"{label:30}{p:>12.4g}{q:>12.4g}{q / p:>11.3f}")
    measured = max(1, int(a.steps) - 2)
    fq = statistics.median(qat_seconds(r) / measured for r in res["qat"])
    print(f"{'fake quantization s/step':30}{'':>12}{fq:>12.4g}  (profile family 'qat', per measured step)")


if __name__ == "__main__":
    main()
