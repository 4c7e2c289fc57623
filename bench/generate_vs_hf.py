#!/usr/bin/env python3
"""Generation tokens/s: `scalelab generate` (KV cache) vs transformers `generate` (PyTorch, CPU),
side by side in one run, on the same small Llama, the same prompt, greedy, the same threads.

The model is made here with transformers (random weights, a fixed seed; no hub) and saved as a
Hugging Face directory that both sides load. Both decode greedily with no EOS for --new-tokens
tokens; the script checks that they produce the same tokens (fp32 greedy: a near-tie can flip one,
it is reported), then prints decode tokens/s (new tokens after the first, over their time),
prefill time and the ratio, round by round (the arms alternate; the VM is shared).

Needs torch and transformers (e.g. the virtualenv of tests/golden/make_textgen_golden.sh):
  .venv-textgen/bin/python bench/generate_vs_hf.py --build build --threads 2

--model-dir DIR runs a real model instead (a Hugging Face Llama directory both sides load), e.g.
SmolLM2-135M-Instruct converted from its GGUF by bench/finetune_vs_hf.py
(build/bench-finetune/smollm2-135m-hf).
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def make_model(out, args):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=2048, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.02,
                      bos_token_id=1, eos_token_id=2, attn_implementation="eager", torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(out, safe_serialization=True)
    return model


def hf_arm(model, prompt, args):
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(ids)  # prefill alone, for its time
        t1 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True)
        t2 = time.perf_counter()
    new = out[0, len(prompt):].tolist()
    total = t2 - t1
    prefill = t1 - t0
    # generate's time = one prefill + (n - 1) decode steps: decode rate over the rest.
    return new, (len(new) - 1) / max(total - prefill, 1e-9), prefill


def scalelab_arm(model_dir, prompt, args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        rec = f.name
    subprocess.run([os.path.join(args.build, "scalelab"), "generate", "--model", model_dir, "--prompt-ids",
                    ",".join(map(str, prompt)), "--max-new-tokens", str(args.new_tokens), "--no-eos", "--quiet",
                    "--threads", str(args.threads), "--json", rec], check=True, stdout=subprocess.DEVNULL)
    a = json.load(open(rec))["answers"][0]
    os.unlink(rec)
    return a["tokens"], a["decode_tokens_per_s"], a["prefill_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--model-dir", default="", help="a Hugging Face Llama directory instead of the random model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir:
            d = args.model_dir
            model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()  # its default attention (sdpa)
            c = model.config
            args.vocab, args.hidden, args.layers = c.vocab_size, c.hidden_size, c.num_hidden_layers
            args.heads, args.kv_heads = c.num_attention_heads, c.num_key_value_heads
        else:
            d = tmp
            model = make_model(d, args)
        n = sum(p.numel() for p in model.parameters())
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, args.vocab, (args.prompt_len,), generator=g).tolist()
        print(f"Llama hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV, vocab "
              f"{args.vocab}, tied ({n / 1e6:.1f} M parameters); prompt {args.prompt_len}, {args.new_tokens} new "
              f"tokens, greedy, {args.threads} threads; torch {torch.__version__}")
        print(f"{'round':>5} | {'scalelab tok/s':>14} | {'transformers tok/s':>18} | {'ratio':>6} | "
              f"{'prefill s (ours / HF)':>22} | same tokens")
        ratios = []
        for r in range(args.rounds):
            arms = [("s", None), ("h", None)] if r % 2 == 0 else [("h", None), ("s", None)]
            res = {}
            for k, _ in arms:
                res[k] = scalelab_arm(d, prompt, args) if k == "s" else hf_arm(model, prompt, args)
            same = res["s"][0] == res["h"][0]
            ratio = res["s"][1] / res["h"][1]
            ratios.append(ratio)
            print(f"{r + 1:>5} | {res['s'][1]:>14.1f} | {res['h'][1]:>18.1f} | {ratio:>5.2f}x | "
                  f"{res['s'][2]:>9.4f} / {res['h'][2]:<10.4f} | {'yes' if same else 'NO'}")
        ratios.sort()
        print(f"median ratio {ratios[len(ratios) // 2]:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
