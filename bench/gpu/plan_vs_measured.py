#!/usr/bin/env python3
"""The memory plan against the measured peak on the GPU: for each ladder rung, one short
`scalelab train --device cuda` run; its run record holds the plan (memory_plan.total_bytes, the
real model run on the meta device for this configuration) and the caching allocator's measured
max reserved bytes. On the CPU the two are equal by test; on CUDA the kernels' workspaces differ
(cuDNN's SDPA, cuBLASLt, the norm and embedding scratch), and this prints by how much.

    python3 bench/gpu/plan_vs_measured.py [--model llama-3.2-1b] [--micro-batch 16] [--seq-len 1024]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

RUNGS = {
    "baseline": [],
    "mixed": ["--mixed-precision", "bf16"],
    "bf16": ["--model-precision", "bf16"],
    "flash": ["--model-precision", "bf16", "--attn", "flash"],
    "fused": ["--model-precision", "bf16", "--attn", "flash", "--fused-kernels"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scalelab", default=os.environ.get("SCALELAB_BIN", ".device/bin/scalelab"))
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rungs", default=",".join(RUNGS))
    ap.add_argument("--timeout-s", type=float, default=90)
    a = ap.parse_args()
    gib = 1024.0 ** 3
    print(f"{a.model}, micro-batch {a.micro_batch}, seq-len {a.seq_len}, --device cuda, 2 steps")
    print(f"{'rung':<9} {'plan GiB':>9} {'measured GiB':>13} {'measured - plan':>16} {'status':>7}")
    for rung in a.rungs.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "run.json")
            cmd = [a.scalelab, "train", "--device", "cuda", "--model", a.model, "--seq-len", str(a.seq_len),
                   "--micro-batch-size", str(a.micro_batch), "--max-steps", "2", "--bench-warmup-steps", "0",
                   "--json", out] + RUNGS[rung]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s)
            except subprocess.TimeoutExpired:
                print(f"{rung:<9} timed out")
                continue
            if not os.path.exists(out):
                print(f"{rung:<9} no record (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.load(open(out))
            plan = r.get("memory_plan", {}).get("total_bytes")
            meas = r.get("max_reserved_bytes")
            if plan is None or meas is None:
                print(f"{rung:<9} record without plan or peak")
                continue
            print(f"{rung:<9} {plan / gib:9.2f} {meas / gib:13.2f} {(meas - plan) / 2**20:13.1f} MiB {r.get('status'):>7}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
