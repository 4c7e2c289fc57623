#!/usr/bin/env python3
"""Golden data for LoRA fine-tuning (scalelab train --lora-rank): peft's LoRA on tiny models.

Run it with make_lora_golden.sh: a virtualenv with the PyPI packages pinned in
requirements-lora.txt (PyTorch for the CPU, transformers, peft). The output under
tests/golden/data/lora/ is committed so that CI needs none of them.

For each case it writes a directory with
  config.json, generation_config.json, model.safetensors   the base model as transformers saves it
  tokens.bin          flat little-endian uint32, sample after sample (seq_len + 1 tokens each), the
                      samples the training steps consume, in order
  adapter_init/       peft's save_pretrained of the freshly initialized adapter (lora_A kaiming-
                      uniform, lora_B 0): adapter_model.safetensors + adapter_config.json; scalelab
                      starts from it with --adapter so that both runs start from the same A and B
  adapter_final/      the same after training
  expected.json       the LoRA settings, the training hyperparameters, the per-step losses and
                      gradient norms, peft's greedy generation with adapter_final (prompt, new
                      tokens, smallest top-1/top-2 logit gap), the library versions

Training is the Hugging Face Trainer's step written out (as make_golden.py): torch.optim.AdamW over
the trainable (adapter) parameters, weight decay on every non-bias, non-norm one (all adapters),
transformers.get_linear_schedule_with_warmup, clip_grad_norm_, loss / grad_accum_steps per
micro-batch.
"""
import argparse
import json
import os
import shutil
import struct

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

SEED = 4242

TRAINING = {
    "micro_batch_size": 2,
    "seq_len": 16,
    "max_steps": 6,
    "warmup_steps": 2,
    "lr": 1e-2,
    "lr_scheduler": "linear",
    "weight_decay": 0.1,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "max_grad_norm": 1.0,
}


def llama_config():
    return LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, initializer_range=0.02, attention_dropout=0.0, hidden_act="silu",
        attn_implementation="eager", torch_dtype="float32")


def opt_config():
    return OPTConfig(
        vocab_size=256, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32, do_layer_norm_before=True, activation_function="relu",
        enable_bias=True, layer_norm_elementwise_affine=True, dropout=0.0, attention_dropout=0.0, layerdrop=0.0,
        init_std=0.02, pad_token_id=1, bos_token_id=2, eos_token_id=2, tie_word_embeddings=True,
        attn_implementation="eager", torch_dtype="float32")


ALL_LLAMA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

CASES = [
    {"name": "llama_gqa_tied_qv", "description": "Llama GQA tied, peft's default targets q_proj,v_proj, r 4, alpha 8",
     "config": llama_config, "cls": LlamaForCausalLM, "r": 4, "alpha": 8.0, "targets": None, "rslora": False,
     "grad_accum_steps": 1},
    {"name": "llama_gqa_tied_all_rslora_accum2",
     "description": "Llama GQA tied, every projection, r 8, alpha 16, rslora, gradient accumulation 2",
     "config": llama_config, "cls": LlamaForCausalLM, "r": 8, "alpha": 16.0, "targets": ALL_LLAMA, "rslora": True,
     "grad_accum_steps": 2},
    {"name": "opt_biases_attn_mlp", "description": "OPT (biases everywhere), q_proj,v_proj,out_proj,fc1,fc2, r 4, alpha 16",
     "config": opt_config, "cls": OPTForCausalLM, "r": 4, "alpha": 16.0,
     "targets": ["q_proj", "v_proj", "out_proj", "fc1", "fc2"], "rslora": False, "grad_accum_steps": 1},
]


def make_tokens(gen, vocab, n_samples, seq_len):
    """Learnable streams (a random successor table over a pool of 24 ids, 20% noise), so that the
    loss moves far more than the tolerance within a few steps."""
    pool = torch.randperm(vocab - 2, generator=gen)[:24] + 2
    succ = torch.randint(0, len(pool), (len(pool),), generator=gen)
    rows = []
    for _ in range(n_samples):
        idx = [int(torch.randint(0, len(pool), (1,), generator=gen))]
        for _ in range(seq_len):
            if float(torch.rand(1, generator=gen)) < 0.2:
                idx.append(int(torch.randint(0, len(pool), (1,), generator=gen)))
            else:
                idx.append(int(succ[idx[-1]]))
        rows.append([int(pool[i]) for i in idx])
    return torch.tensor(rows, dtype=torch.int64)


def make_case(case, out_root):
    torch.manual_seed(SEED)
    config = case["config"]()
    base = case["cls"](config).float()
    t = dict(TRAINING)
    t["grad_accum_steps"] = case["grad_accum_steps"]
    mb, seq, steps, accum = t["micro_batch_size"], t["seq_len"], t["max_steps"], t["grad_accum_steps"]
    out = os.path.join(out_root, case["name"])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    base.save_pretrained(out, safe_serialization=True)

    lcfg = LoraConfig(r=case["r"], lora_alpha=case["alpha"], lora_dropout=0.0, target_modules=case["targets"],
                      use_rslora=case["rslora"], bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, lcfg)
    model.train()
    model.save_pretrained(os.path.join(out, "adapter_init"), safe_serialization=True)

    gen = torch.Generator().manual_seed(SEED + 1)
    tokens = make_tokens(gen, config.vocab_size, steps * accum * mb, seq)
    flat = tokens.reshape(-1).tolist()
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dI" % len(flat), *flat))

    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(
        "lora_" in n for n, p in model.named_parameters() if p.requires_grad), "only the adapters train"
    optimizer = torch.optim.AdamW(trainable, lr=t["lr"], betas=(t["adam_beta1"], t["adam_beta2"]),
                                  eps=t["adam_epsilon"], weight_decay=t["weight_decay"])
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, t["warmup_steps"], steps)
    losses, norms = [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(accum):
            i0 = (step * accum + k) * mb
            batch = tokens[i0:i0 + mb]
            logits = model(input_ids=batch[:, :seq]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            (loss / accum).backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(trainable, t["max_grad_norm"])))
        optimizer.step()
        scheduler.step()
        losses.append(total / accum)
    assert losses[-1] < losses[0] - 0.05, f"{case['name']}: the loss barely moves ({losses})"
    model.save_pretrained(os.path.join(out, "adapter_final"), safe_serialization=True)

    # Greedy generation with the trained adapter (scalelab generate --adapter DIR/adapter_final):
    # the new tokens, and the smallest gap between the best and second-best logit along the way
    # (kept well above rounding, so that an equal fp32 engine cannot pick another token).
    model.eval()
    prompt = tokens[0, :6].tolist()
    with torch.no_grad():
        g = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                           eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    new = g.sequences[0, len(prompt):].tolist()
    margin = min(float(torch.topk(s[0], 2).values[0] - torch.topk(s[0], 2).values[1]) for s in g.scores)
    assert margin > 1e-4, f"{case['name']}: greedy generation has a near tie ({margin})"

    expected = {
        "description": case["description"],
        "lora": {"r": case["r"], "alpha": case["alpha"], "targets": case["targets"] or ["q_proj", "v_proj"],
                 "rslora": case["rslora"], "dropout": 0.0},
        "training": t,
        "losses": losses,
        "grad_norms": norms,
        "generate": {"prompt_ids": prompt, "max_new_tokens": 8, "tokens": new, "min_margin": margin},
        "trainable_params": sum(p.numel() for p in trainable),
        "total_params": sum(p.numel() for p in model.parameters()),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
    print(f"{case['name']}: losses {['%.5f' % x for x in losses]} grad norms {['%.3f' % x for x in norms]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", help="names to generate (default: all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for c in CASES:
        if not a.cases or c["name"] in a.cases:
            make_case(c, a.out)


if __name__ == "__main__":
    main()
