#!/usr/bin/env python3
"""DPO vs LoRA SFT with the same trainer, side by side: median step time, sequences/s, peak
reserved memory (measured and planned), arms alternating round by round (the VM is shared; read
the per-round ratios). Uses python3 only.

Both arms are LoRA (r 8 on all 7 projections) over the same model and sequence length and pass the
same number of sequences through the policy per step: SFT with micro-batch 2B, DPO with B pairs
(2B rows, [chosen; rejected]). DPO adds the reference forward (the same network with its adapters
off), so the expected ratio is about (forward + forward + backward) / (forward + backward).

  python3 bench/dpo_vs_lora.py --build build [--model llama-small] [--pairs-per-batch 2] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import tempfile

from scalelab_run import run

ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

WORDS = ("the a model answer question kind short long river city number red blue green cold warm "
         "runs walks reads writes good bad thanks please yes no maybe").split()


def make_pairs(path, n, words_per_text):
    """Synthetic preference pairs: prompts and completions of plain words (the byte-level tokenizer of
    the preset has none: --tokenizer is the repository's small Llama-3-style one)."""
    import random
    rng = random.Random(1)
    with open(path, "w") as f:
        for _ in range(n):
            text = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))
            f.write(json.dumps({"prompt": text(words_per_text // 4), "chosen": " " + text(words_per_text),
                                "rejected": " " + text(words_per_text)}) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="llama-small")
    ap.add_argument("--seq-len", default="256")
    ap.add_argument("--pairs-per-batch", type=int, default=2)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--steps", default="6")
    ap.add_argument("--rank", default="8")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tokenizer = os.path.join(repo, "tests/golden/data/tokenizer/llama3_style/tokenizer.json")
    tmp = tempfile.mkdtemp()
    pairs = os.path.join(tmp, "pairs.jsonl")
    # Completions long enough to fill the sequence (cut to it), so both arms compute seq-len tokens.
    make_pairs(pairs, 64, int(a.seq_len))
    common = ["--model", a.model, "--seq-len", a.seq_len, "--threads", a.threads, "--max-steps", a.steps,
              "--bench-warmup-steps", "2", "--lora-rank", a.rank, "--lora-alpha", str(2 * int(a.rank)),
              "--lora-targets", ALL]
    B = a.pairs_per_batch
    arms = {"sft": ("train", ["--micro-batch-size", str(2 * B), "--data", "synthetic"]),
            "dpo": ("dpo", ["--micro-batch-size", str(B), "--pairs", pairs, "--tokenizer", tokenizer])}
    res = {k: [] for k in arms}
    for rnd in range(a.rounds):
        for name, (cmd, extra) in (arms.items() if rnd % 2 == 0 else reversed(list(arms.items()))):
            res[name].append(run(a.build, extra, common, cmd))
        s, d = res["sft"][-1]["step_time_s"], res["dpo"][-1]["step_time_s"]
        print(f"round {rnd + 1}: LoRA SFT {s:.3f} s/step, DPO {d:.3f} s/step, dpo/sft {d / s:.3f}")
    gib = 1 << 30
    print(f"\n{a.model}, seq {a.seq_len}, {2 * B} sequences per step through the policy (SFT micro-batch {2 * B}, "
          f"DPO {B} pairs), fp32, {a.threads} threads, LoRA r {a.rank} on {ALL}")
    print(f"{'':30}{'LoRA SFT':>12}{'DPO':>12}{'dpo/sft':>10}")
    rows = []
    st = lambda arm: statistics.median(r["step_time_s"] for r in res[arm])
    rows.append(("median step time (s)", st("sft"), st("dpo")))
    seqs = 2 * B
    rows.append(("policy sequences/s", seqs / st("sft"), seqs / st("dpo")))
    s0, d0 = res["sft"][0], res["dpo"][0]
    rows.append(("peak reserved, measured GiB", s0["max_reserved_bytes"] / gib, d0["max_reserved_bytes"] / gib))
    rows.append(("peak reserved, plan GiB", s0["memory_plan"]["total_bytes"] / gib, d0["memory_plan"]["total_bytes"] / gib))
    for label, s, d in rows:
        print(f"{label:30}{s:>12.4g}{d:>12.4g}{d / s:>10.3f}")
    print(f"DPO final: loss {d0['final_loss']:.4f}, reward accuracy {d0['final_reward_accuracy']:.3f} (synthetic pairs)")


if __name__ == "__main__":
    main()
