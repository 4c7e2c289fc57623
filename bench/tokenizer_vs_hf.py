#!/usr/bin/env python3
"""Tokenizer throughput, scalelab vs Hugging Face `tokenizers` (Rust), side by side in one run.

Both encode every non-empty line of the same corpus (as a batch of documents, special tokens
added) at 1 thread and at all threads, best of --rounds (both keep their BPE caches warm across
rounds; HF through encode_batch_fast, its path without offsets, where present). The corpus is Debian text: /usr/share/common-licenses plus the packages' changelogs
under /usr/share/doc, up to --mb megabytes. The HF side runs only where the tokenizer virtualenv
exists (--venv, default /work/venvs/tokenizer or $SCALELAB_TOKENIZER_VENV).

  python3 bench/tokenizer_vs_hf.py --build build [--mb 8] [--rounds 3]
"""
import argparse
import glob
import gzip
import json
import os
import subprocess
import sys

HF = r'''
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
raw = open(sys.argv[2], "rb").read()
lines = [l.decode("utf-8", "replace") for l in raw.split(b"\n") if l]
# encode_batch_fast: HF's quicker batch path (no offsets), where the version has it.
encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
best, first = 1e30, None
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    enc = encode(lines, add_special_tokens=True)
    best = min(best, time.perf_counter() - t0)
    first = first or time.perf_counter() - t0
print(json.dumps({"impl": "hf-tokenizers", "seconds": best, "mb_per_s": len(raw) / 1e6 / best,
                  "first_mb_per_s": len(raw) / 1e6 / first,
                  "tokens": sum(len(e.ids) for e in enc), "lines": len(lines)}))
'''


def make_corpus(path, mb):
    parts = []
    size = 0
    for f in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(f) and not os.path.islink(f):
            parts.append(open(f, "rb").read())
            size += len(parts[-1])
    for f in sorted(glob.glob("/usr/share/doc/*/changelog*.gz")):
        if size >= mb * 1e6:
            break
        try:
            parts.append(gzip.open(f).read())
            size += len(parts[-1])
        except OSError:
            pass
    with open(path, "wb") as out:
        out.write(b"\n".join(parts)[: int(mb * 1e6)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--venv", default=os.environ.get("SCALELAB_TOKENIZER_VENV", "/work/venvs/tokenizer"))
    ap.add_argument("--corpus", default="/tmp/scalelab_tokenizer_bench.txt")
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    make_corpus(args.corpus, args.mb)
    ncpu = os.cpu_count()
    py = os.path.join(args.venv, "bin", "python")
    have_hf = os.path.exists(py)
    if not have_hf:
        print(f"note: {py} is missing: HF tokenizers side skipped (tests/golden/tokenizer/make_tokenizer_golden.sh makes it)")
    tokenizers = [("GPT-2 (50,257)", "real_gpt2"), ("Llama 3 (128,256)", "real_llama3"), ("llama3_style (1,507)", "llama3_style")]
    print(f"corpus: {args.corpus}, {os.path.getsize(args.corpus) / 1e6:.1f} MB; {ncpu} CPUs; best of {args.rounds}")
    print("| tokenizer | threads | scalelab MB/s | HF tokenizers MB/s | scalelab / HF | first round (cold caches): scalelab / HF MB/s | tokens equal |")
    print("|---|---|---|---|---|---|---|")
    for label, name in tokenizers:
        tj = os.path.join(repo, "tests/golden/data/tokenizer", name, "tokenizer.json")
        if not os.path.exists(tj):
            print(f"| {label} | - | (absent: make_tokenizer_golden.py --real) | | | | |")
            continue
        ours = subprocess.run([os.path.join(args.build, "bench", "bench_tokenizer"), "--tokenizer", tj, "--corpus", args.corpus,
                               "--threads", f"1,{ncpu}", "--rounds", str(args.rounds)], check=True, capture_output=True, text=True)
        rows = [json.loads(l) for l in ours.stdout.splitlines() if l.startswith("{")]
        for row in rows:
            hf = None
            if have_hf:
                env = dict(os.environ, RAYON_NUM_THREADS=str(row["threads"]),
                           TOKENIZERS_PARALLELISM="false" if row["threads"] == 1 else "true")
                r = subprocess.run([py, "-c", HF, tj, args.corpus, str(args.rounds)], env=env, check=True,
                                   capture_output=True, text=True)
                hf = json.loads(r.stdout.strip().splitlines()[-1])
            ratio = f"**{row['mb_per_s'] / hf['mb_per_s']:.2f}×**" if hf else "-"
            same = ("yes" if hf["tokens"] == row["tokens"] else f"NO ({row['tokens']} vs {hf['tokens']})") if hf else "-"
            hf_s = f"{hf['mb_per_s']:.2f}" if hf else "-"
            cold = f"{row['first_mb_per_s']:.2f} / {hf['first_mb_per_s']:.2f} = {row['first_mb_per_s'] / hf['first_mb_per_s']:.2f}×" if hf else f"{row['first_mb_per_s']:.2f} / -"
            print(f"| {label} | {row['threads']} | {row['mb_per_s']:.2f} | {hf_s} | {ratio} | {cold} | {same} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
