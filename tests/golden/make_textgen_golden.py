#!/usr/bin/env python3
"""Golden data for evaluation and generation (scalelab train --val-data, scalelab generate).

Run it with make_textgen_golden.sh (`make golden-textgen`): a virtualenv with the PyPI packages
pinned in requirements-textgen.txt (PyTorch for the CPU and transformers). The output under
tests/golden/data/textgen/ is committed so that CI needs neither.

For each tiny model (a Llama with GQA and untied head, a Llama with llama3 rope scaling and tied
embeddings, an OPT) it writes a directory with
  config.json, generation_config.json, model.safetensors   as transformers saves them (fp32)
  val.bin          flat little-endian uint32 validation tokens: n_samples samples of seq_len + 1
                   tokens plus a remainder shorter than a sample (dropped, as scalelab drops it)
  expected.json    "val_loss": transformers' `.loss` of the model on all the samples at once
                   (labels = input_ids: the mean cross-entropy over n_samples * seq_len targets);
                   "generate": for each prompt, HF `generate` greedy output ids (new tokens only),
                   with max_new_tokens and the eos_token_id it ran with, and the smallest margin
                   between the best and the second-best logit along the way (kept well above
                   rounding, so a correct fp32 engine cannot pick another token)
  expected.safetensors
                   "logits.<i>": the logits [prompt + generated - 1 positions, vocab] of prompt i
                   followed by its generated tokens, one forward pass without a cache

And warpers.json: random logits (quantized to steps of 0.25 so that ties are common, plus rows with
-inf entries) and, for settings of temperature, top_k, top_p and min_tokens_to_keep, the processed
logits of transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper applied in
that order (as `generate` does): kept entries are finite, removed ones -inf.
"""
import argparse
import json
import math
import os
import shutil
import struct

import torch
import transformers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from safetensors.torch import save_file

SEED = 20261126
VOCAB = 96
SEQ_LEN = 12
N_VAL_SAMPLES = 7      # not a multiple of the test's micro-batch sizes: the last batch is partial
REMAINDER = 5          # tokens after the last whole sample, dropped
MAX_NEW_TOKENS = 16
MIN_MARGIN = 1e-3      # smallest accepted top-1 / top-2 logit gap in greedy decoding


def llama(tied, rope_scaling):
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=500000.0 if rope_scaling else 10000.0, rope_scaling=rope_scaling,
        tie_word_embeddings=tied, initializer_range=0.25, attention_dropout=0.0, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, attn_implementation="eager", torch_dtype="float32")


def opt():
    return OPTConfig(
        vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=64, do_layer_norm_before=True,
        activation_function="relu", enable_bias=True, layer_norm_elementwise_affine=True, dropout=0.0,
        attention_dropout=0.0, layerdrop=0.0, init_std=0.25, pad_token_id=1, bos_token_id=2,
        eos_token_id=2, tie_word_embeddings=True, attn_implementation="eager", torch_dtype="float32")


ROPE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}

CASES = [
    ("llama_gqa_untied", LlamaForCausalLM, lambda: llama(False, None)),
    ("llama_tied_rope3", LlamaForCausalLM, lambda: llama(True, dict(ROPE_LLAMA3))),
    ("opt_prenorm", OPTForCausalLM, opt),
]

PROMPTS = [[5, 17, 33, 8], [40], [3, 3, 3, 3, 3, 3, 3, 9, 60, 12, 77]]


def write_tokens(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<%dI" % len(tokens), *tokens))


def greedy_margin(model, ids):
    """The smallest top-1 minus top-2 logit gap over the positions that chose generated tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    top2 = torch.topk(logits, 2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min()), logits


def make_case(name, cls, make_config, out_root):
    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for attempt in range(50):
        torch.manual_seed(SEED + attempt)
        model = cls(make_config()).eval()
        gens, ok = [], True
        for p in PROMPTS:
            with torch.no_grad():
                full = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                      max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0].tolist()
            margin, _ = greedy_margin(model, full[:-1])
            if margin < MIN_MARGIN:
                ok = False
                break
            gens.append(full[len(p):])
        if ok:
            break
    else:
        raise SystemExit(f"{name}: no seed gave greedy margins above {MIN_MARGIN}")
    model.save_pretrained(out, safe_serialization=True)

    # EOS: the third generated token of the first prompt becomes the EOS of a second run, which must
    # stop right after emitting it (HF keeps the EOS in its output).
    eos = gens[0][2]
    records, expected = [], {}
    for i, p in enumerate(PROMPTS):
        with torch.no_grad():
            stopped = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                     max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=eos,
                                     pad_token_id=0)[0].tolist()[len(p):]
        margin, logits = greedy_margin(model, p + gens[i][:-1])
        expected[f"logits.{i}"] = logits.contiguous()
        records.append({"prompt": p, "max_new_tokens": MAX_NEW_TOKENS, "greedy": gens[i],
                        "eos_token_id": eos, "greedy_with_eos": stopped, "min_margin": margin})

    g = torch.Generator().manual_seed(SEED + 7)
    n = N_VAL_SAMPLES * (SEQ_LEN + 1) + REMAINDER
    val = torch.randint(0, VOCAB, (n,), generator=g).tolist()
    write_tokens(os.path.join(out, "val.bin"), val)
    samples = torch.tensor(val[: N_VAL_SAMPLES * (SEQ_LEN + 1)]).view(N_VAL_SAMPLES, SEQ_LEN + 1)
    with torch.no_grad():
        val_loss = float(model(input_ids=samples, labels=samples).loss)
    save_file(expected, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"model": name, "seed": SEED + attempt, "seq_len": SEQ_LEN, "val_samples": N_VAL_SAMPLES,
                   "val_tokens": n, "val_loss": val_loss, "generate": records,
                   "versions": {"torch": torch.__version__, "transformers": transformers.__version__}},
                  f, indent=1)
    print(f"{name}: val_loss {val_loss:.6f}, greedy margins >= {min(r['min_margin'] for r in records):.4f}")


WARPER_SETTINGS = [
    {"temperature": 1.0, "top_k": 5, "top_p": 1.0, "min_tokens_to_keep": 1},
    {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "min_tokens_to_keep": 1},
    {"temperature": 1.0, "top_k": 0, "top_p": 0.9, "min_tokens_to_keep": 1},
    {"temperature": 1.0, "top_k": 0, "top_p": 0.5, "min_tokens_to_keep": 1},
    {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_tokens_to_keep": 1},
    {"temperature": 0.5, "top_k": 8, "top_p": 0.8, "min_tokens_to_keep": 1},
    {"temperature": 1.5, "top_k": 3, "top_p": 0.95, "min_tokens_to_keep": 5},
    {"temperature": 2.0, "top_k": 0, "top_p": 0.05, "min_tokens_to_keep": 3},
    {"temperature": 0.3, "top_k": 0, "top_p": 0.01, "min_tokens_to_keep": 1},
    {"temperature": 1.0, "top_k": 200, "top_p": 0.3, "min_tokens_to_keep": 1},
]


def make_warpers(out_root):
    g = torch.Generator().manual_seed(SEED + 11)
    rows, V = 16, 64
    logits = torch.round(torch.randn(rows, V, generator=g) * 2.0 * 4) / 4  # steps of 0.25: many ties
    logits[3, :] = 0.5                        # a row of equal logits
    logits[5, 10:] = -math.inf                # a row with only 10 candidates
    logits[6, ::2] = -math.inf
    cases = []
    for s in WARPER_SETTINGS:
        procs = []
        if s["temperature"] != 1.0:
            procs.append(TemperatureLogitsWarper(s["temperature"]))
        if s["top_k"] != 0:
            procs.append(TopKLogitsWarper(top_k=s["top_k"], min_tokens_to_keep=s["min_tokens_to_keep"]))
        if s["top_p"] < 1.0:
            procs.append(TopPLogitsWarper(top_p=s["top_p"], min_tokens_to_keep=s["min_tokens_to_keep"]))
        x = logits.clone()
        for p in procs:
            x = p(None, x)
        cases.append({**s, "processed": [[None if math.isinf(v) else v for v in r] for r in x.tolist()]})
    with open(os.path.join(out_root, "warpers.json"), "w") as f:
        json.dump({"logits": [[None if math.isinf(v) else v for v in r] for r in logits.tolist()],
                   "cases": cases, "note": "null is -inf",
                   "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}, f)
    print(f"warpers: {len(cases)} settings x {rows} rows")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    for name, cls, cfg in CASES:
        make_case(name, cls, cfg, a.out)
    make_warpers(a.out)


if __name__ == "__main__":
    main()
