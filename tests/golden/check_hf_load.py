#!/usr/bin/env python3
"""Loads checkpoint directories (e.g. saved by scalelab) with Hugging Face transformers and checks
that they load cleanly and compute the expected logits.

Run it with the interpreter of the golden virtualenv (tests/golden/make_golden.sh creates
<repo>/.venv-golden: Debian's PyTorch 1.13 + the pinned transformers).

One check:
  check_hf_load.py --model DIR --tokens tokens.bin --seq-len 16 --num-samples 2 \\
      [--expected-logits expected.safetensors] [--reference-model DIR [--reference-dtype bfloat16]] [--atol 1e-5]
Several in one process (faster: transformers imports once):
  check_hf_load.py --spec checks.json      # a JSON list of objects with the same keys (model, tokens, ...)

For each check, the model is loaded with from_pretrained(torch_dtype=float32) and
output_loading_info=True; missing, unexpected or mis-shaped keys fail the check. Logits of the
first num_samples samples of tokens.bin (inputs: the first seq_len tokens of each seq_len + 1
sample) are compared with
  - the "logits" tensor of --expected-logits, or
  - the logits of --reference-model whose parameters are first rounded to --reference-dtype
    (what a save in that dtype must reproduce exactly), or
  - nothing (only a clean load and finite logits are checked).
Exit status: 0 all checks pass, 1 a check failed, 2 bad arguments.
"""
import argparse
import json
import struct
import sys

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()


def read_tokens(path, seq_len, num_samples):
    with open(path, "rb") as f:
        data = f.read()
    n = len(data) // 4
    ids = struct.unpack("<%dI" % n, data[: 4 * n])
    need = num_samples * (seq_len + 1)
    if n < need:
        raise ValueError(f"{path} has {n} tokens, {need} needed for {num_samples} samples of seq_len {seq_len}")
    rows = [ids[i * (seq_len + 1) : i * (seq_len + 1) + seq_len] for i in range(num_samples)]
    return torch.tensor(rows, dtype=torch.int64)


def load(path):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, torch_dtype=torch.float32, output_loading_info=True, attn_implementation="eager"
    )
    model.eval()
    return model, info


def logits_of(model, inputs):
    with torch.no_grad():
        return model(input_ids=inputs).logits.float()


def run_check(c):
    name = c["model"]
    model, info = load(c["model"])
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        return False, f"{name}: transformers reports {problems}"
    inputs = read_tokens(c["tokens"], int(c["seq_len"]), int(c["num_samples"]))
    got = logits_of(model, inputs)
    if not torch.isfinite(got).all():
        return False, f"{name}: logits are not finite"
    if c.get("expected_logits"):
        from safetensors.torch import load_file

        want = load_file(c["expected_logits"])["logits"]
        want = want[: inputs.shape[0]]
    elif c.get("reference_model"):
        ref, _ = load(c["reference_model"])
        dtype = getattr(torch, c.get("reference_dtype", "float32"))
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(p.to(dtype).float())
        want = logits_of(ref, inputs)
    else:
        return True, f"{name}: loaded cleanly, logits {tuple(got.shape)} finite"
    if tuple(want.shape) != tuple(got.shape):
        return False, f"{name}: logits shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    diff = float((got - want).abs().max())
    atol = float(c.get("atol", 1e-5))
    ok = diff <= atol
    return ok, f"{name}: max |logits - expected| = {diff:.3g} (atol {atol:g})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", help="JSON file with a list of checks")
    ap.add_argument("--model")
    ap.add_argument("--tokens")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--num-samples", type=int, default=1)
    ap.add_argument("--expected-logits")
    ap.add_argument("--reference-model")
    ap.add_argument("--reference-dtype", default="float32")
    ap.add_argument("--atol", type=float, default=1e-5)
    a = ap.parse_args()
    if a.spec:
        with open(a.spec) as f:
            checks = json.load(f)
    elif a.model and a.tokens and a.seq_len:
        checks = [
            {
                "model": a.model,
                "tokens": a.tokens,
                "seq_len": a.seq_len,
                "num_samples": a.num_samples,
                "expected_logits": a.expected_logits,
                "reference_model": a.reference_model,
                "reference_dtype": a.reference_dtype,
                "atol": a.atol,
            }
        ]
    else:
        ap.print_usage(sys.stderr)
        print("check_hf_load.py: give --spec FILE, or --model, --tokens and --seq-len", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    failed = 0
    for c in checks:
        try:
            ok, msg = run_check(c)
        except Exception as e:  # a load error is a failed check, reported with its message
            ok, msg = False, f"{c.get('model')}: {type(e).__name__}: {e}"
        print(("ok    " if ok else "FAIL  ") + msg)
        failed += 0 if ok else 1
    print(f"check_hf_load: {len(checks) - failed} of {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
