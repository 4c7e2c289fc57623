#!/usr/bin/env python3
"""Checks that peft loads the adapters scalelab saves (not run in CI: it needs the virtualenv of
make_lora_golden.sh). For each case of tests/golden/data/lora/ it trains with scalelab from peft's
initial adapter, then loads scalelab's --save directory with PeftModel.from_pretrained and checks
that (1) the loaded lora_A/lora_B equal the file bit for bit, (2) the adapted model's logits equal
those of peft's own trained adapter (adapter_final/) within 1e-5, and (3) `scalelab merge` of
adapter_final equals peft's merge_and_unload within 1e-6 (weights) and 1e-5 (logits).

  <venv>/bin/python tests/golden/check_peft_load.py --scalelab build/scalelab
"""
import argparse
import json
import os
import subprocess
import tempfile

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scalelab", required=True)
    a = ap.parse_args()
    root = os.path.join(HERE, "data", "lora")
    for case in sorted(os.listdir(root)):
        d = os.path.join(root, case)
        e = json.load(open(os.path.join(d, "expected.json")))
        t, lo = e["training"], e["lora"]
        out = tempfile.mkdtemp(prefix="lora_")
        cmd = [a.scalelab, "train", "--model", d, "--data", os.path.join(d, "tokens.bin"), "--quiet",
               "--micro-batch-size", str(t["micro_batch_size"]), "--seq-len", str(t["seq_len"]),
               "--max-steps", str(t["max_steps"]), "--warmup-steps", str(t["warmup_steps"]),
               "--grad-accum-steps", str(t["grad_accum_steps"]), "--lr", str(t["lr"]),
               "--weight-decay", str(t["weight_decay"]), "--adam-epsilon", str(t["adam_epsilon"]),
               "--max-grad-norm", str(t["max_grad_norm"]), "--lora-rank", str(lo["r"]),
               "--lora-alpha", str(lo["alpha"]), "--lora-targets", ",".join(lo["targets"]),
               "--adapter", os.path.join(d, "adapter_init"), "--save", out] + (["--rslora"] if lo["rslora"] else [])
        subprocess.run(cmd, check=True)
        mine = load_file(os.path.join(out, "adapter_model.safetensors"))
        m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(d), out)
        sd = m.state_dict()
        assert all(torch.equal(sd[k.replace(".weight", ".default.weight")], v) for k, v in mine.items()), case
        ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(d), os.path.join(d, "adapter_final"))
        ids = torch.arange(t["seq_len"]).unsqueeze(0) + 3
        diff = (m(ids).logits - ref(ids).logits).abs().max().item()
        assert diff < 1e-5, f"{case}: logits differ by {diff}"
        merged = tempfile.mkdtemp(prefix="merged_")
        subprocess.run([a.scalelab, "merge", os.path.join(d, "adapter_final"), "--model", d, "--into", merged],
                       check=True, stdout=subprocess.DEVNULL)
        ref_merged = ref.merge_and_unload()
        mw = load_file(os.path.join(merged, "model.safetensors"))
        wdiff = max((mw[k] - ref_merged.state_dict()[k]).abs().max().item() for k in mw)
        ldiff = (AutoModelForCausalLM.from_pretrained(merged)(ids).logits - ref_merged(ids).logits).abs().max().item()
        assert wdiff < 1e-6 and ldiff < 1e-5, f"{case}: merge differs from peft's by {wdiff} / {ldiff}"
        print(f"{case}: scalelab merge = peft merge_and_unload within {wdiff:.1e} (weights), {ldiff:.1e} (logits)")
        print(f"{case}: peft loads scalelab's adapter; logits within {diff:.2e} of peft's trained adapter")


if __name__ == "__main__":
    main()
