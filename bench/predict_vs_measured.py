#!/usr/bin/env python3
"""Predicted vs measured peak memory of the Hugging Face Trainer: `scalelab plan --stack
hf-trainer --json` for every configuration that bench/gpu/hf_memory.py measured (the records in
bench/gpu/results/*/hf_memory.jsonl, and the HF rows of the earlier compare.json runs), side by
side, with the error of max_memory_reserved and max_memory_allocated, the segments the allocator holds
after the last step (small pool + large pool, measured / predicted: where they differ, the replay laid
out the cache differently even when the peaks agree), and the prediction's time.

    python3 bench/predict_vs_measured.py --build build [--results DIR ...]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

GIB = 2**30


def flags(rec):
    f = ["--model", rec["model"], "--seq-len", str(rec["seq_len"]), "--micro-batch-size", str(rec["micro_batch_size"]),
         "--model-precision", rec["model_precision"], "--mixed-precision", rec["mixed_precision"],
         "--attn", "flash" if rec["attn"] == "sdpa" else rec["attn"]]
    if rec.get("activation_checkpointing"):
        f.append("--activation-checkpointing")
    if rec.get("fused"):
        f.append("--fused-kernels")
    if rec["model"].startswith("opt") and rec.get("dropout", 0) is not None:
        f += ["--dropout", "0"]  # hf_memory.py runs OPT without dropout
    if rec.get("steps"):
        f += ["--steps", str(rec["steps"])]
    if rec.get("torchrun"):  # hf_memory.py's "-torchrun1" rows: DDP over one process
        f += ["--launcher", "torchrun"]
    v = rec.get("versions") or {}
    if v.get("torch"):  # the releases the row ran (an older transformers from a carried wheel)
        f += ["--torch-version", v["torch"]]
    if v.get("transformers"):
        f += ["--transformers-version", v["transformers"]]
    return f


def compare_rows(results):
    """The HF rows of the earlier scalelab-vs-HF runs (bench/gpu/compare.py: hf_benchmark.py, the
    model built on the GPU, full bf16 as model.to(bf16) without autocast, OPT with its config's
    dropout 0.1; --liger rows are Liger-Kernel 0.8.5)."""
    rows, seen = [], set()

    def walk(o, src):
        if isinstance(o, dict):
            if o.get("side") == "hf" and o.get("status") == "ok" and "micro_batch_size" in o:
                key = (o["model"], o["torch_dtype"], o["mixed_precision"], o["attn"], o["micro_batch_size"], o.get("liger"))
                if key not in seen:
                    seen.add(key)
                    rows.append(dict(name=f"{o['model']}-{o['torch_dtype']}-{o['mixed_precision']}-{o['attn']}"
                                          f"{'-liger' if o.get('liger') else ''}-mb{o['micro_batch_size']} ({src})",
                                     fused=bool(o.get("liger")),
                                     model=o["model"], seq_len=o["seq_len"], micro_batch_size=o["micro_batch_size"],
                                     model_precision="bf16" if o["torch_dtype"] == "bfloat16" else "fp32",
                                     mixed_precision=o["mixed_precision"], attn=o["attn"], steps=o.get("steps_run"),
                                     dropout=None, max_reserved_bytes=o["max_reserved_bytes"],
                                     max_allocated_bytes=o["max_allocated_bytes"]))
            for v in o.values():
                walk(v, src)
        elif isinstance(o, list):
            for v in o:
                walk(v, src)
    for d in results:
        for path in sorted(glob.glob(os.path.join(d, "*", "compare*.json"))):
            walk(json.load(open(path)), os.path.basename(os.path.dirname(path)))
    return rows


def measured(results):
    rows = []
    for d in results:
        for path in sorted(glob.glob(os.path.join(d, "*", "hf_memory.jsonl"))):
            for line in open(path):
                r = json.loads(line)
                if r.get("status") in ("ok", "oom") and r.get("max_reserved_bytes"):
                    r["source"] = os.path.basename(os.path.dirname(path))
                    tf = (r.get("versions") or {}).get("transformers", "")
                    if tf and not tf.startswith("5.17"):  # an older release (bench/gpu/run.sh versions)
                        r["name"] = f"{r['name']} (transformers {tf})"
                    rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--results", nargs="*", default=[os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu", "results")])
    a = ap.parse_args()
    exe = os.path.join(a.build, "scalelab")
    rows = measured(a.results) + compare_rows(a.results)
    print("| config | measured reserved | predicted reserved | error | measured allocated | predicted allocated | error | "
          "segments small + large, measured / predicted | largest mb (64 GiB) | plan command ms (process + search) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst_r = worst_a = 0.0
    for r in rows:
        dev = f"{r['emulate_gib']}GiB" if r.get("emulate_gib") else "150109880320"
        with tempfile.NamedTemporaryFile(suffix=".json") as tf:
            t0 = time.perf_counter()
            p = subprocess.run([exe, "plan", "--stack", "hf-trainer", *flags(r), "--device-memory", "64GiB",
                                "--json", tf.name], capture_output=True, text=True)
            ms = (time.perf_counter() - t0) * 1000
            if p.returncode != 0:
                print(f"| {r['name']} | | | {p.stderr.strip()[:120]} |")
                continue
            j = json.load(open(tf.name))
        # the reserved / allocated peaks do not depend on the device size unless it runs out
        with tempfile.NamedTemporaryFile(suffix=".json") as tf:
            subprocess.run([exe, "plan", "--stack", "hf-trainer", *flags(r), "--device-memory", dev, "--json", tf.name],
                           capture_output=True, text=True, check=True)
            k = json.load(open(tf.name))
        er = (k["max_reserved_bytes"] - r["max_reserved_bytes"]) / r["max_reserved_bytes"] * 100
        ea = (k["max_allocated_bytes"] - r["max_allocated_bytes"]) / r["max_allocated_bytes"] * 100
        worst_r, worst_a = max(worst_r, abs(er)), max(worst_a, abs(ea))
        # the segments live after the last step (hf_memory.py records them per step; no empty_cache)
        segs = ""
        last = (r.get("per_step") or [{}])[-1]
        if last.get("large_segments") is not None and k.get("per_step"):
            ps = k["per_step"][min(len(k["per_step"]), len(r["per_step"])) - 1]
            segs = (f"{last['segments'] - last['large_segments']} + {last['large_segments']} / "
                    f"{ps['segments'] - ps['large_segments']} + {ps['large_segments']}")
        # a run that ran out of memory (its peaks are up to the failure): did the prediction too?
        if r.get("status") == "oom" or not k.get("fits", True):
            segs += (f" OOM measured {'yes' if r.get('status') == 'oom' else 'no'}, "
                     f"predicted {'no' if k.get('fits', True) else 'yes'}")
        print(f"| {r['name']} | {r['max_reserved_bytes'] / GIB:.3f} GiB | {k['max_reserved_bytes'] / GIB:.3f} GiB | {er:+.2f} % | "
              f"{r['max_allocated_bytes'] / GIB:.3f} GiB | {k['max_allocated_bytes'] / GIB:.3f} GiB | {ea:+.3f} % | {segs} | "
              f"{j['largest_micro_batch']} | {ms:.0f} |")
    print(f"\nworst |error|: reserved {worst_r:.2f} %, allocated {worst_a:.3f} % over {len(rows)} measured configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
