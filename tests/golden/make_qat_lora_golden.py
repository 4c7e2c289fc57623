#!/usr/bin/env python3
"""Golden data for QAT + LoRA (scalelab train --qat 8da4w --lora-rank R): torchtune's recipe.

Run it with make_qat_lora_golden.sh (the pinned virtualenv of requirements-qat.txt: PyTorch for the
CPU, torchao, transformers; torchtune itself is not needed). Output: tests/golden/data/qat_lora/,
committed, so CI needs no Python.

The reference is torchtune's QATLoRALinear (torchtune/modules/peft/lora.py) written out: the frozen
base weight and the layer's input fake-quantized by torchao's fake quantizers, the adapters in full
precision on the *unquantized* input on top:
    out = F.linear(act_fq(x), weight_fq(W)) + (alpha / r) * lora_b(lora_a(x))
act_fq / weight_fq are the fake quantizers of torchao's Int8DynActInt4WeightQATLinear (int8
per-token asymmetric activations, int4 symmetric weights in groups of GROUP columns) — the same
modules make_qat_golden.py ties scalelab's kernels to bit for bit.

A tiny Llama (GQA, tied embeddings; the config of make_qat_golden.py), every linear module of the
decoder layers wrapped (q/k/v/o/gate/up/down, r 8, alpha 16); the embeddings, norms and the tied LM
head stay full precision and frozen. The adapters start from adapter_init/ (PEFT's format, which
scalelab reads with --adapter): A kaiming-uniform as peft and torchtune draw it, and B *not zero*
(normal, std 0.02) so that the adapters' forward and input gradient take part from the first step.
Training is the Hugging Face Trainer's step written out (AdamW with weight decay on the adapters,
linear schedule with warmup, clip_grad_norm_ over the adapters, gradient accumulation 2).

expected.json: per-step losses and gradient norms, and "ulp_spread": the largest relative loss
difference per step of the same run from adapters one ulp away, over ULP_RUNS ways of moving them
(every element up, every element down, and random directions): the reference's own sensitivity to
a rounding difference, which fake quantization amplifies; the test's tolerance after the first step
comes from it. One direction alone underestimates it: where a ~1e-7 difference moves an activation
across an int8 boundary depends on the difference, so another summation order (scalelab's kernels)
lands anywhere in that envelope. adapter_final/: the trained adapters (PEFT's names).
"""
import argparse
import json
import math
import os
import shutil
import struct

import torch
import torchao
import transformers
from safetensors.torch import save_file
from torchao.quantization.qat.linear import Int8DynActInt4WeightQATLinear
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 2611
GROUP = 32
RANK = 8
ALPHA = 16.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

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
    "grad_accum_steps": 2,
}


class QatLoraLinear(torch.nn.Module):
    """torchtune's QATLoRALinear.forward over a frozen nn.Linear weight (no bias, no dropout)."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        out_dim, in_dim = base.weight.shape
        q = Int8DynActInt4WeightQATLinear(in_dim, out_dim, bias=False, groupsize=GROUP)
        self.activation_fake_quantizer = q.activation_fake_quantizer
        self.weight_fake_quantizer = q.weight_fake_quantizer
        self.weight = torch.nn.Parameter(base.weight.detach().clone(), requires_grad=False)
        self.lora_a = torch.nn.Linear(in_dim, RANK, bias=False)
        self.lora_b = torch.nn.Linear(RANK, out_dim, bias=False)

    def forward(self, x):
        out = torch.nn.functional.linear(self.activation_fake_quantizer(x), self.weight_fake_quantizer(self.weight))
        return out + (ALPHA / RANK) * self.lora_b(self.lora_a(x))


def wrap(model):
    """Every targeted linear of model.model.layers becomes a QatLoraLinear; returns {peft name: module}."""
    sites = {}
    for li, layer in enumerate(model.model.layers):
        for parent_name, parent in (("self_attn", layer.self_attn), ("mlp", layer.mlp)):
            for name in TARGETS:
                if hasattr(parent, name):
                    m = QatLoraLinear(getattr(parent, name))
                    setattr(parent, name, m)
                    sites[f"base_model.model.model.layers.{li}.{parent_name}.{name}"] = m
    assert len(sites) == 7 * len(model.model.layers), sorted(sites)
    return sites


def adapter_tensors(sites):
    t = {}
    for prefix, m in sites.items():
        t[prefix + ".lora_A.weight"] = m.lora_a.weight.detach().contiguous().clone()
        t[prefix + ".lora_B.weight"] = m.lora_b.weight.detach().contiguous().clone()
    return t


def save_adapter(path, tensors):
    os.makedirs(path)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0,
              "target_modules": TARGETS, "use_rslora": False, "use_dora": False, "bias": "none",
              "base_model_name_or_path": "", "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)


ULP_RUNS = 8  # one-ulp moves of the adapters the spread is taken over


def one_ulp(v, run):
    """v moved one ulp per element: run 0 all up, run 1 all down, later runs each element up or down
    at random (seeded by the run)."""
    up = torch.nextafter(v, torch.full_like(v, float("inf")))
    down = torch.nextafter(v, torch.full_like(v, float("-inf")))
    if run == 0:
        return up
    if run == 1:
        return down
    g = torch.Generator().manual_seed(SEED + 100 + run)
    return torch.where(torch.rand(v.shape, generator=g) < 0.5, up, down)


def train(config, base_state, init, tokens, t, perturb=None):
    model = LlamaForCausalLM(config).float()
    model.load_state_dict(base_state)
    for p in model.parameters():
        p.requires_grad_(False)
    sites = wrap(model)
    with torch.no_grad():
        for prefix, m in sites.items():
            for ab, lin in (("lora_A", m.lora_a), ("lora_B", m.lora_b)):
                v = init[f"{prefix}.{ab}.weight"]
                if perturb is not None:
                    v = one_ulp(v, perturb)
                lin.weight.copy_(v)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    assert len(params) == 2 * len(sites)
    optimizer = torch.optim.AdamW(params, lr=t["lr"], betas=(t["adam_beta1"], t["adam_beta2"]),
                                  eps=t["adam_epsilon"], weight_decay=t["weight_decay"])
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, t["warmup_steps"], t["max_steps"])
    mb, seq, accum = t["micro_batch_size"], t["seq_len"], t["grad_accum_steps"]
    losses, norms = [], []
    for step in range(t["max_steps"]):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(accum):
            i = (step * accum + k) * mb
            batch = tokens[i:i + mb]
            logits = model(input_ids=batch[:, :seq]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            (loss / accum).backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, t["max_grad_norm"])))
        optimizer.step()
        scheduler.step()
        losses.append(total / accum)
    return sites, losses, norms


def make_tokens(gen, vocab, n_samples, seq_len):
    """Learnable streams (a successor table over 24 ids, 20% noise), as make_qat_golden.py."""
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, initializer_range=0.02, attention_dropout=0.0, hidden_act="silu",
        attn_implementation="eager", torch_dtype="float32")
    model = LlamaForCausalLM(config).float()
    model.save_pretrained(a.out, safe_serialization=True)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    t = dict(TRAINING)
    gen = torch.Generator().manual_seed(SEED + 1)
    n_samples = t["max_steps"] * t["grad_accum_steps"] * t["micro_batch_size"]
    tokens = make_tokens(gen, config.vocab_size, n_samples, t["seq_len"])
    flat = tokens.reshape(-1).tolist()
    with open(os.path.join(a.out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dI" % len(flat), *flat))

    # The initial adapters: A as peft/torchtune (kaiming_uniform_, a = sqrt(5)), B small and nonzero.
    init_model = LlamaForCausalLM(config).float()
    init_sites = wrap(init_model)
    g = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for m in init_sites.values():
            bound = 1.0 / math.sqrt(m.lora_a.weight.shape[1])  # kaiming_uniform_(a=sqrt(5)) on [r, in]
            m.lora_a.weight.copy_((torch.rand(m.lora_a.weight.shape, generator=g) * 2 - 1) * bound)
            m.lora_b.weight.copy_(torch.randn(m.lora_b.weight.shape, generator=g) * 0.02)
    init = adapter_tensors(init_sites)
    save_adapter(os.path.join(a.out, "adapter_init"), init)

    sites, losses, norms = train(config, base_state, init, tokens, t)
    assert losses[-1] < losses[0] - 0.05, f"the loss barely moves ({losses})"
    spread = [0.0] * len(losses)
    for run in range(ULP_RUNS):
        _, ulp_losses, _ = train(config, base_state, init, tokens, t, perturb=run)
        spread = [max(s, abs(x - y) / abs(x)) for s, x, y in zip(spread, losses, ulp_losses)]
    save_adapter(os.path.join(a.out, "adapter_final"), adapter_tensors(sites))

    expected = {
        "description": "Llama GQA tied, QAT 8da4w (group 32) on every decoder linear, LoRA r 8 alpha 16 on all 7 "
                       "projections (torchtune's QATLoRALinear), gradient accumulation 2",
        "qat": {"scheme": "8da4w", "group_size": GROUP},
        "lora": {"r": RANK, "alpha": ALPHA, "targets": TARGETS, "rslora": False, "dropout": 0.0},
        "training": t,
        "losses": losses,
        "grad_norms": norms,
        "ulp_spread": spread,
        "versions": {"torch": torch.__version__, "torchao": torchao.__version__,
                     "transformers": transformers.__version__},
    }
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
    print(f"qat+lora: losses {['%.5f' % x for x in losses]} grad norms {['%.3f' % x for x in norms]}; "
          f"one-ulp spread over {ULP_RUNS} runs {['%.2g' % x for x in spread]}")


if __name__ == "__main__":
    main()
