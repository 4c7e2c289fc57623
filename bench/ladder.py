#!/usr/bin/env python3
"""The optimization ladder on this CPU, for llama-small and opt-small (issue 3's evidence).

Runs `scalelab ladder` for each model under one emulated device-memory cap, prints the seeds'
table (rung, micro-batch, model precision, mixed precision, attention, fused, tokens/s/device,
max reserved GiB, speedup vs baseline), then checks the direction the physics predicts from the
engine's memory plan at each rung's micro-batch:
  - bf16 weights halve the weight, gradient and optimizer-state bytes;
  - flash attention removes the S x S scores term;
  - fused kernels remove the logits term;
  - the largest micro-batch grows at each "larger batch" rung, and (Llama) the last rung fits
    at least 5x the baseline's micro-batch under the same cap.

    python3 bench/ladder.py [--build build] [--models llama-small,opt-small] [--seq-len 1024]
                            [--device-memory 3GiB] [--steps 2] [--out runs/bench-ladder]
"""
import argparse, json, os, subprocess, sys


def plan(exe, model, seq, cap, rung):
    flags = ["--model", model, "--seq-len", str(seq), "--device-memory", cap,
             "--micro-batch-size", str(rung["micro_batch_size"]),
             "--model-precision", rung["model_precision"], "--mixed-precision", rung["mixed_precision"],
             "--attn", rung["attn"]]
    if rung["fused_kernels"] in (True, "yes", "true"):
        flags.append("--fused-kernels")
    out = os.path.join(args.out, "plan.json")
    subprocess.run([exe, "plan"] + flags + ["--json", out], check=True, capture_output=True, text=True)
    with open(out) as f:
        j = json.load(f)
    return {it["name"]: it["bytes"] for it in j["items"]}


def gib(b):
    return b / 2**30


def main():
    global args
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default="llama-small,opt-small")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--device-memory", default="3GiB")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default="runs/bench-ladder")
    args = ap.parse_args()
    exe = os.path.join(args.build, "scalelab")
    os.makedirs(args.out, exist_ok=True)
    failures = []
    for model in args.models.split(","):
        js = os.path.join(args.out, f"{model}.json")
        cmd = [exe, "ladder", "--model", model, "--seq-len", str(args.seq_len), "--device-memory",
               args.device_memory, "--max-steps", str(args.steps), "--bench-warmup-steps", "1",
               "--threads", str(args.threads), "--db", os.path.join(args.out, "ladder.db"), "--json", js]
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:])
            failures.append(f"{model}: ladder exited {r.returncode}")
            continue
        with open(js) as f:
            lad = json.load(f)
        rungs = [x for x in lad["rungs"] if x["status"] == "ok"]
        print(f"\n## {model}, seq-len {args.seq_len}, device memory {args.device_memory}, this CPU\n")
        print("| rung | micro-batch | model precision | mixed precision | attention | fused | tokens/s/device | max reserved GiB | speedup |")
        print("|---|---:|---|---|---|---|---:|---:|---:|")
        for x in lad["rungs"]:
            if x["status"] != "ok":
                print(f"| {x['rung']} | | | | | | | | n/a: {x['note']} |")
                continue
            print(f"| {x['rung']} | {x['micro_batch_size']} | {x['model_precision']} | {x['mixed_precision']} | "
                  f"{x['attn']} | {x['fused_kernels']} | {x['tokens_per_s_per_device']:.1f} | "
                  f"{x['memory_gib']:.2f} | {x['speedup']:.2f}x |")
        for n in lad.get("notes", []):
            print(n)
        # The physics, from the plan at each rung's micro-batch.
        by = {x["rung"]: x for x in rungs}
        print("\nPhysics checks (from `scalelab plan` at each rung's micro-batch):")
        def check(ok, text):
            print(("  ok    " if ok else "  FAIL  ") + text)
            if not ok:
                failures.append(f"{model}: {text}")
        if "baseline" in by and "full bf16" in by:
            a, b = plan(exe, model, args.seq_len, args.device_memory, by["baseline"]), \
                plan(exe, model, args.seq_len, args.device_memory, by["full bf16"])
            for part in ("weights", "gradients", "optimizer states"):
                check(abs(b[part] / a[part] - 0.5) < 0.01,
                      f"bf16 weights halve the {part}: {gib(a[part]):.3f} -> {gib(b[part]):.3f} GiB")
        if "full bf16, larger batch" in by and "flash attention" in by:
            a, b = plan(exe, model, args.seq_len, args.device_memory, by["full bf16, larger batch"]), \
                plan(exe, model, args.seq_len, args.device_memory, by["flash attention"])
            check(a.get("attention scores", 0) > 0 and "attention scores" not in b,
                  f"flash removes the S x S scores: {gib(a.get('attention scores', 0)):.3f} GiB -> none")
        if "flash attention, larger batch" in by and "fused kernels" in by:
            a, b = plan(exe, model, args.seq_len, args.device_memory, by["flash attention, larger batch"]), \
                plan(exe, model, args.seq_len, args.device_memory, by["fused kernels"])
            check(a.get("logits", 0) > 0 and "logits" not in b,
                  f"fused kernels remove the logits: {gib(a.get('logits', 0)):.3f} GiB -> none "
                  f"(chunk buffer {gib(b.get('fused loss chunk', 0)):.3f} GiB)")
        mbs = [(x["rung"], x["micro_batch_size"]) for x in rungs if "max batch" in x["rung"] or "larger batch" in x["rung"]]
        for (r0, m0), (r1, m1) in zip(mbs, mbs[1:]):
            check(m1 > m0, f"the largest micro-batch grows: {r0} {m0} -> {r1} {m1}")
        if rungs:
            base, last = rungs[0]["micro_batch_size"], rungs[-1]["micro_batch_size"]
            base_max = by.get("baseline, max batch", rungs[0])["micro_batch_size"]
            ratio = last / base_max
            text = f"last rung fits {ratio:.1f}x the baseline's largest micro-batch ({base_max} -> {last})"
            if model.startswith("llama"):
                check(ratio >= 5, text + " (target >= 5x)")
            else:
                print("  info  " + text)
        print()
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
