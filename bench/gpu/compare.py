#!/usr/bin/env python3
"""scalelab vs the reference practice (Hugging Face Trainer) on one GPU, rung by rung.

For each model and each rung of the optimization ladder, each side runs at its own largest
micro-batch (found by real trials: doubling, then bisection, each trial a fresh process, an OOM
ends a trial and nothing else), and the table gives tokens/s/GPU, max reserved GiB and MFU for both,
with the scalelab/HF ratio of tokens/s:

  rung      scalelab train flags                              HF side (hf_benchmark.py)
  baseline  fp32 weights, no mixed precision, eager, unfused  float32, bf16=False, eager
  mixed     --mixed-precision bf16                            float32, TrainingArguments(bf16=True)
  bf16      --model-precision bf16 (full bf16)                model.to(bfloat16), bf16=False
  flash     + --attn flash                                    + attn_implementation="sdpa"
  fused     + --fused-kernels                                 + Liger-Kernel (Llama only)

MFU = (6·N + 12·L·H·Q·T) · tokens/s / peak, N the matmul parameters (LM head included), with the
peak the bf16 dense matmul rate measured at the start of the same run (torch.matmul of two
8192 x 8192 bf16 matrices, mean time of 10 after a warm-up), so both sides are held to one number.

Both sides run the same number of steps with the same warm-up excluded, seq-len 1024 by default,
random ids in [0, 1000), AdamW (lr 5e-5, linear decay, clip 1.0). Each scalelab search starts from
`scalelab plan`'s largest micro-batch for the GPU's free memory (verified by trials); each HF
search starts from scalelab's limit for the same rung (HF's own limit is then found around it).

Everything respects --budget-s: a search stops when its next trial could not finish (its limit is
then reported as a lower bound) and what does not fit is skipped with a line saying so. Raw results
go to $OUT/compare.json (or --json), rewritten after each search, and the table (also
$OUT/compare.md) is the last thing printed.

    python3 bench/gpu/compare.py                                  # everything that fits in 480 s
    python3 bench/gpu/compare.py --models llama-3.2-1b --rungs bf16,flash,fused --budget-s 500
    python3 bench/gpu/compare.py --micro-batch 8 --rungs baseline     # no search, one size
    python3 bench/gpu/compare.py --reuse prev/compare.json --trust-reuse  # measure known limits only
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_benchmark as hfb  # noqa: E402

RUNGS = {
    "baseline": {"label": "baseline (fp32, eager)",
                 "scalelab": {"model_precision": "fp32", "mixed_precision": "no", "attn": "eager", "fused": False},
                 "hf": {"torch_dtype": "float32", "mixed_precision": "no", "attn": "eager", "liger": False}},
    "mixed": {"label": "bf16 mixed precision",
              "scalelab": {"model_precision": "fp32", "mixed_precision": "bf16", "attn": "eager", "fused": False},
              "hf": {"torch_dtype": "float32", "mixed_precision": "bf16", "attn": "eager", "liger": False}},
    "bf16": {"label": "full bf16",
             "scalelab": {"model_precision": "bf16", "mixed_precision": "no", "attn": "eager", "fused": False},
             "hf": {"torch_dtype": "bfloat16", "mixed_precision": "no", "attn": "eager", "liger": False}},
    "flash": {"label": "+ flash attention (HF: sdpa)",
              "scalelab": {"model_precision": "bf16", "mixed_precision": "no", "attn": "flash", "fused": False},
              "hf": {"torch_dtype": "bfloat16", "mixed_precision": "no", "attn": "sdpa", "liger": False}},
    "fused": {"label": "+ fused kernels (HF: Liger)",
              "scalelab": {"model_precision": "bf16", "mixed_precision": "no", "attn": "flash", "fused": True},
              "hf": {"torch_dtype": "bfloat16", "mixed_precision": "no", "attn": "sdpa", "liger": True}},
}

PEAK_SNIPPET = r"""
import json, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
t_end = time.time() + 1.5                      # warm-up: clocks up, cuBLAS heuristics cached
while time.time() < t_end:
    c = torch.matmul(a, b)
torch.cuda.synchronize()
ts = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); c = torch.matmul(a, b); e.record(); e.synchronize()
    ts.append(s.elapsed_time(e) / 1e3)
mean = sum(ts) / len(ts)
del a, b, c
torch.cuda.empty_cache()
free, total = torch.cuda.mem_get_info()
print(json.dumps({"n": n, "times_s": ts, "mean_s": mean, "peak_tflops": 2 * n**3 / mean / 1e12,
                  "best_tflops": 2 * n**3 / min(ts) / 1e12, "gpu": torch.cuda.get_device_name(),
                  "free_bytes": free, "total_bytes": total, "torch": torch.__version__,
                  "cuda": torch.version.cuda}))
"""


def log(msg=""):
    print(msg, flush=True)


def find_scalelab(explicit):
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    dev = os.environ.get("SCALELAB_DEVICE_DIR", ".device")
    for c in (os.environ.get("SCALELAB_BIN"), os.path.join(dev, "bin", "scalelab"), os.path.join(dev, "scalelab"),
              "build-device/scalelab", "build/scalelab"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return shutil.which("scalelab")


def scalelab_flags(model, seq, mb, rung, a):
    r = RUNGS[rung]["scalelab"]
    f = ["--model", hfb.TINY_NAME[model] if a.tiny else model, "--seq-len", str(seq), "--micro-batch-size", str(mb),
         "--model-precision", r["model_precision"], "--mixed-precision", r["mixed_precision"], "--attn", r["attn"],
         "--device", a.device]
    if r["fused"]:
        f.append("--fused-kernels")
    return f + a.scalelab_arg


def scalelab_trial(exe, model, rung, a, cap):
    def trial(mb, timeout):
        timeout = cap if timeout is None else min(timeout, cap)
        with tempfile.TemporaryDirectory() as td:
            jp = os.path.join(td, "run.json")
            cmd = [exe, "train"] + scalelab_flags(model, a.seq_len, mb, rung, a) + [
                "--max-steps", str(a.steps), "--bench-warmup-steps", str(a.warmup), "--quiet", "--json", jp]
            rc, out = hfb.run_cmd(cmd, timeout)
            rec = hfb.child_record(rc, out, jp)
        if rec.get("status") == "ok" and rec.get("max_reserved_bytes") is not None:
            rec["max_reserved_gib"] = rec["max_reserved_bytes"] / 2**30
        if rec.get("status") not in ("ok", "oom") and not rec.get("error"):
            rec["error"] = f"exit {rc}: " + "\n".join(out.strip().splitlines()[-3:])[-400:]
        # Keep the record small in compare.json: drop per-step series and the plan.
        for k in ("learning_rates", "grad_norms", "step_times", "plan", "memory_plan", "telemetry", "profile"):
            rec.pop(k, None)
        return rec
    return trial


def scalelab_plan_guess(exe, model, rung, a, free_bytes):
    """`scalelab plan`'s largest micro-batch for the free GPU memory, or None."""
    with tempfile.TemporaryDirectory() as td:
        jp = os.path.join(td, "plan.json")
        for extra in ([], ["--device", "cpu"]):  # a plan that refuses --device cuda: plan as if on CPU
            flags = scalelab_flags(model, a.seq_len, 1, rung, a) + extra
            rc, out = hfb.run_cmd([exe, "plan"] + flags + ["--device-memory", str(int(free_bytes)), "--json", jp], 60)
            if rc == 0 and os.path.exists(jp):
                try:
                    with open(jp) as f:
                        b = json.load(f).get("max_micro_batch_size")
                    return int(b) if b and b > 0 else None
                except (OSError, ValueError, TypeError):
                    return None
    return None


def hf_args(model, rung, a, mb=1):
    r = RUNGS[rung]["hf"]
    argv = ["--model", model, "--seq-len", str(a.seq_len), "--micro-batch-size", str(mb),
            "--torch-dtype", r["torch_dtype"], "--mixed-precision", r["mixed_precision"],
            "--attn", a.hf_flash if r["attn"] == "sdpa" else r["attn"],
            "--max-steps", str(a.steps), "--warmup-steps", str(a.warmup), "--device", a.device]
    if a.tiny:
        argv.append("--tiny")
    if r["liger"]:
        argv.append("--liger")
    if a.tf32:
        argv.append("--tf32")
    return hfb.parse_args(argv)


def hf_trial(model, rung, a, cap):
    base = hfb.hf_trial(hf_args(model, rung, a), cap, a.hf_python)

    def trial(mb, timeout):
        rec = base(mb, timeout)
        rec.pop("step_times_s", None)
        return rec
    return trial


def fmt(x, spec, empty=""):
    return empty if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama-3.2-1b,opt-1.3b")
    ap.add_argument("--rungs", default=",".join(RUNGS), help="of: " + ", ".join(RUNGS))
    ap.add_argument("--sides", default="scalelab,hf")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6, help="steps of every trial")
    ap.add_argument("--warmup", type=int, default=2, help="steps excluded from throughput")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--min-task-s", type=float, default=25, help="skip a search with less time than this left")
    ap.add_argument("--trial-timeout-s", type=float, default=240)
    ap.add_argument("--micro-batch", type=int, help="no search: both sides at this micro-batch")
    ap.add_argument("--max-micro-batch", type=int, default=512)
    ap.add_argument("--tolerance", type=float, default=0.0,
                    help="stop bisecting when the gap is at most max(1, tolerance x micro-batch)")
    ap.add_argument("--reuse", help="a previous compare.json: its limits are the searches' starting guesses")
    ap.add_argument("--trust-reuse", action="store_true",
                    help="with --reuse: measure at the reused limits only, no search")
    ap.add_argument("--resume", help="a previous compare.json: its finished rows (an exact limit, or a "
                    "fixed micro-batch, and a throughput) are kept and not run again; MFU uses this run's peak")
    ap.add_argument("--no-plan", action="store_true", help="do not start scalelab's search from `scalelab plan`")
    ap.add_argument("--scalelab", help="the scalelab binary (default: $SCALELAB_BIN, .device/, build/)")
    ap.add_argument("--scalelab-arg", action="append", default=[],
                    help="an extra flag for every `scalelab train` (repeatable, e.g. --scalelab-arg=--threads=8)")
    ap.add_argument("--hf-python", default=sys.executable)
    ap.add_argument("--hf-flash", default="sdpa", choices=["sdpa", "flash_attention_2"],
                    help="HF attention for the flash rungs")
    ap.add_argument("--tf32", action="store_true", help="HF side: allow TF32 in fp32 matmuls (off in PyTorch)")
    ap.add_argument("--peak-tflops", type=float, help="skip the matmul measurement, use this peak")
    ap.add_argument("--json", help="raw results (default $OUT/compare.json when OUT is set)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test this script")
    ap.add_argument("--tiny", action="store_true",
                    help="llama-tiny / opt-tiny on both sides (a smoke test of this script)")
    a = ap.parse_args()

    t_start = time.time()
    deadline = t_start + a.budget_s
    out_dir = os.environ.get("OUT")
    json_path = a.json or (os.path.join(out_dir, "compare.json") if out_dir else None)
    md_path = os.path.join(out_dir, "compare.md") if out_dir else None
    models = [m for m in a.models.split(",") if m]
    rungs = [r for r in a.rungs.split(",") if r]
    sides = [s for s in a.sides.split(",") if s]
    for m in models:
        if m not in hfb.MODELS:
            sys.exit(f"compare: unknown model {m} (known: {', '.join(hfb.MODELS)})")
    for r in rungs:
        if r not in RUNGS:
            sys.exit(f"compare: unknown rung {r} (known: {', '.join(RUNGS)})")

    doc = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": vars(a), "notes": [], "results": [],
           "skipped": []}

    def note(msg):
        log("compare: " + msg)
        doc["notes"].append(msg)

    def save():
        doc["elapsed_s"] = round(time.time() - t_start, 1)
        if json_path:
            os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=1)

    # The peak, and the free memory, from a separate process (this one never initializes CUDA, so
    # it holds no GPU memory while the trials run).
    peak = None
    if a.device == "cuda":
        rc, out = hfb.run_cmd([a.hf_python, "-c", PEAK_SNIPPET], 120)
        try:
            doc["gpu"] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            doc["gpu"] = {"error": (out or "")[-800:]}
            note(f"the matmul peak could not be measured (exit {rc}): {(out or '').strip()[-300:]}")
    else:
        doc["gpu"] = {"gpu": f"no GPU ({a.device})"}
    if a.peak_tflops:
        peak = a.peak_tflops
        doc["peak_source"] = "--peak-tflops"
    elif "peak_tflops" in doc["gpu"]:
        peak = doc["gpu"]["peak_tflops"]
        doc["peak_source"] = "measured: torch.matmul 8192^3 bf16, mean of 10"
    doc["peak_tflops"] = peak
    free = doc["gpu"].get("free_bytes")
    if peak:
        log(f"compare: {doc['gpu'].get('gpu', '?')}: bf16 matmul peak {peak:.1f} TFLOP/s "
            f"({doc.get('peak_source')}); free {fmt(free and free / 2**30, '.1f', '?')} GiB")

    # The sides that can run.
    exe = None
    if "scalelab" in sides:
        exe = find_scalelab(a.scalelab)
        if not exe:
            note("scalelab side skipped: no scalelab binary (give --scalelab, $SCALELAB_BIN or .device/)")
        else:
            with tempfile.TemporaryDirectory() as td:
                jp = os.path.join(td, "smoke.json")
                rc, out = hfb.run_cmd([exe, "train", "--model", "llama-tiny", "--seq-len", "64", "--micro-batch-size",
                                       "1", "--max-steps", "1", "--device", a.device, "--quiet", "--json", jp], 120)
            if rc != 0:
                note(f"scalelab side skipped: `{exe} train --device {a.device}` fails on llama-tiny (exit {rc}): "
                     + " | ".join(out.strip().splitlines()[-3:])[-400:])
                exe = None
            else:
                doc["scalelab"] = exe
                v = hfb.run_cmd([exe, "version"], 30)[1].strip()
                doc["scalelab_version"] = v.splitlines()[0] if v else None
    hf_ok = False
    if "hf" in sides:
        rc, out = hfb.run_cmd([a.hf_python, "-c", "import torch, transformers, accelerate; "
                               "print(torch.__version__, transformers.__version__, accelerate.__version__, "
                               "torch.cuda.is_available())"], 120)
        if rc != 0 or (a.device == "cuda" and not out.strip().endswith("True")):
            note("HF side skipped: " + ("no CUDA device for torch" if rc == 0 else
                                        "torch/transformers/accelerate do not import: " + out.strip()[-300:]))
        else:
            hf_ok = True
            doc["hf_versions"] = hfb.run_cmd([a.hf_python, "-c", "import json, sys; sys.path.insert(0, %r); "
                                              "import hf_benchmark as h; print(json.dumps(h.versions()))" % HERE],
                                             60)[1].strip().splitlines()[-1:]
            try:
                doc["hf_versions"] = json.loads(doc["hf_versions"][0])
            except (ValueError, IndexError):
                pass
    save()

    reuse = {}
    if a.reuse:
        with open(a.reuse) as f:
            for r in json.load(f).get("results", []):
                if r.get("max_micro_batch_size"):
                    reuse[(r["model"], r["rung"], r["side"])] = r["max_micro_batch_size"]

    limits = {}  # (model, rung, side) -> largest micro-batch found
    done = set()
    if a.resume:
        with open(a.resume) as f:
            prev = json.load(f)
        for r in prev.get("results", []):
            key = (r["model"], r["rung"], r["side"])
            if (r["model"] in models and r["rung"] in rungs and r["side"] in sides and r.get("tokens_per_s_per_device")
                    and (r.get("exact") or not r.get("searched"))):
                r = dict(r, resumed_from=a.resume)
                r["mfu"] = r["flops_per_token"] * r["tokens_per_s_per_device"] / (peak * 1e12) if peak else r.get("mfu")
                doc["results"].append(r)
                done.add(key)
                if r.get("max_micro_batch_size"):
                    limits[key] = r["max_micro_batch_size"]
        note(f"resumed {len(done)} finished rows from {a.resume} (measured then, MFU against this run's peak)")
    flops_noted = set()
    for model in models:
        d = hfb.model_config(model, a.tiny)
        fpt = hfb.flops_per_token(d, a.seq_len)
        plan_free = free - (512 << 20) if free else None  # leave the CUDA context its share
        for ri, rung in enumerate(rungs):
            for side in sides:
                key = (model, rung, side)
                label = f"{model} / {rung} / {side}"
                if key in done:
                    continue
                if side == "scalelab" and not exe:
                    continue
                if side == "hf" and not hf_ok:
                    continue
                if side == "hf" and RUNGS[rung]["hf"]["liger"] and d["model_type"] != "llama":
                    doc["skipped"].append({"model": model, "rung": rung, "side": side,
                                           "why": "Liger-Kernel has no OPT patch: no fused-kernel rung on the HF side"})
                    log(f"compare: {label}: n/a (Liger-Kernel has no OPT support)")
                    continue
                left = deadline - time.time()
                if left < a.min_task_s:
                    doc["skipped"].append({"model": model, "rung": rung, "side": side,
                                           "why": f"budget: {left:.0f} s left of {a.budget_s:.0f}"})
                    log(f"compare: {label}: skipped, {left:.0f} s left of the {a.budget_s:.0f} s budget")
                    continue
                cap = min(a.trial_timeout_s, left)
                trial = scalelab_trial(exe, model, rung, a, cap) if side == "scalelab" else hf_trial(model, rung, a, cap)
                # Where the search starts.
                # A guess grows (or shrinks) by steps that double from step x guess: small steps
                # from a guess that should be close (the plan, an earlier run), larger ones from a
                # rough one (the other side's limit, the previous rung's).
                start, step, source = 1, None, "doubling from 1"
                if a.micro_batch:
                    start, source = a.micro_batch, "--micro-batch"
                elif key in reuse:
                    start, step, source = reuse[key], 1 / 16, "--reuse"
                elif side == "scalelab" and not a.no_plan and plan_free:
                    g = scalelab_plan_guess(exe, model, rung, a, plan_free)
                    if g:
                        start, step, source = min(g, a.max_micro_batch), 1 / 16, f"scalelab plan ({g})"
                if side == "hf" and not a.micro_batch and key not in reuse and (model, rung, "scalelab") in limits:
                    start, step, source = limits[(model, rung, "scalelab")], 1 / 4, "scalelab's limit"
                if step is None and not a.micro_batch and ri > 0 and (model, rungs[ri - 1], side) in limits:
                    start, step, source = limits[(model, rungs[ri - 1], side)], 1 / 2, "the previous rung's limit"
                log(f"compare: {label}: start at micro-batch {start} ({source}), {left:.0f} s left")
                t0 = time.time()
                if a.micro_batch or (a.trust_reuse and key in reuse):
                    rec = trial(start, deadline - time.time())
                    res = {"status": rec.get("status"), "max_micro_batch_size": start if rec.get("status") == "ok" else None,
                           "exact": False, "lower_bound": False, "searched": False,
                           "stopped": None if rec.get("status") == "ok" else rec.get("error"),
                           "probes": [{"micro_batch_size": start, "status": rec.get("status")}], "best": rec}
                    log(f"  micro-batch {start}: {rec.get('status')}"
                        + (f", {rec['tokens_per_s_per_device']:.0f} tokens/s" if rec.get("tokens_per_s_per_device") else "")
                        + (f" ({rec.get('error')})" if rec.get("status") != "ok" else ""))
                else:
                    res = hfb.find_max_batch(trial, start=start, guess_step=step, max_mb=a.max_micro_batch,
                                             deadline=deadline, tol=a.tolerance, min_trial_s=min(a.min_task_s, 20),
                                             log=log)
                    res["searched"] = True
                best = res.get("best") or {}
                row = {"model": model, "rung": rung, "rung_label": RUNGS[rung]["label"], "side": side,
                       "flags": RUNGS[rung][side], "start": start, "start_source": source,
                       "seconds": round(time.time() - t0, 1), **res}
                row["flops_per_token"] = fpt
                if side == "scalelab" and best.get("flops_per_token") and model not in flops_noted:
                    rel = abs(best["flops_per_token"] - fpt) / fpt
                    if rel > 1e-3:
                        flops_noted.add(model)
                        note(f"{model}: scalelab's flops_per_token {best['flops_per_token']:.4e} differs from "
                             f"this script's {fpt:.4e} by {100 * rel:.2f} %")
                tps = best.get("tokens_per_s_per_device") if best.get("status") == "ok" else None
                row["tokens_per_s_per_device"] = tps
                row["max_reserved_gib"] = best.get("max_reserved_gib") if tps else None
                row["mfu"] = fpt * tps / (peak * 1e12) if (tps and peak) else None
                if res.get("max_micro_batch_size"):
                    limits[key] = res["max_micro_batch_size"]
                doc["results"].append(row)
                save()
                log(f"compare: {label}: {res['status']}, micro-batch {res.get('max_micro_batch_size')}"
                    + ("" if res.get("exact") or not res.get("searched") else f" (lower bound: {res.get('stopped')})")
                    + (f", {tps:.0f} tokens/s" if tps else "") + f" [{row['seconds']:.0f} s]")

    # The table, last.
    by = {(r["model"], r["rung"], r["side"]): r for r in doc["results"]}
    lines = [f"scalelab vs HF Trainer, {doc['gpu'].get('gpu', 'GPU ?')}, seq-len {a.seq_len}, {a.steps} steps "
             f"({a.warmup} warm-up) per trial, each side at its largest micro-batch; MFU against the measured "
             f"bf16 matmul peak {fmt(peak, '.1f', '?')} TFLOP/s",
             "",
             "| model | rung | side | micro-batch | tokens/s/GPU | max reserved GiB | MFU | scalelab/HF |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    skipped = {(s["model"], s["rung"], s["side"]): s["why"] for s in doc["skipped"]}
    for model in models:
        for rung in rungs:
            for side in sides:
                key = (model, rung, side)
                r = by.get(key)
                if r is None:
                    why = skipped.get(key) or ("side not available" if (side == "scalelab" and not exe) or
                                               (side == "hf" and not hf_ok) else "not run")
                    lines.append(f"| {model} | {rung} | {side} | | | | | n/a: {why} |")
                    continue
                mb = r.get("max_micro_batch_size")
                mbs = "" if mb is None else (str(mb) + ("" if r.get("exact") or not r.get("searched") else "+"))
                ratio = ""
                if side == "scalelab":
                    o = by.get((model, rung, "hf"))
                    if r.get("tokens_per_s_per_device") and o and o.get("tokens_per_s_per_device"):
                        ratio = f"{r['tokens_per_s_per_device'] / o['tokens_per_s_per_device']:.2f}x"
                if not r.get("tokens_per_s_per_device"):
                    ratio = f"n/a: {r.get('status')}: {str(r.get('stopped') or (r.get('best') or {}).get('error'))[:100]}"
                lines.append(f"| {model} | {rung} | {side} | {mbs} | {fmt(r.get('tokens_per_s_per_device'), ',.0f')}"
                             f" | {fmt(r.get('max_reserved_gib'), '.2f')} | "
                             f"{fmt(r.get('mfu') and 100 * r['mfu'], '.1f')}{'%' if r.get('mfu') else ''} | {ratio} |")
    lines.append("")
    lines.append("micro-batch N+ = a lower bound (the search stopped early: budget, a timeout or an error)")
    if doc["notes"]:
        lines.append("notes: " + " | ".join(doc["notes"]))
    lines.append(f"elapsed {time.time() - t_start:.0f} s of a {a.budget_s:.0f} s budget; raw results: "
                 f"{json_path or '(no OUT, no --json)'}")
    doc["table_md"] = "\n".join(lines)
    save()
    if md_path:
        with open(md_path, "w") as f:
            f.write(doc["table_md"] + "\n")
    log("")
    log(doc["table_md"])


if __name__ == "__main__":
    main()
