#!/usr/bin/env python3
"""Generates scalelab's golden reference data with PyTorch and Hugging Face transformers.

Run it through make_golden.sh (`make golden`): that creates a virtualenv on top of Debian's
/usr/bin/python3 (python3-torch, PyTorch 1.13) with the pinned transformers below, then runs this
script. The output under tests/golden/data/ is committed so that CI needs neither.

For each case it writes a directory with
  config.json, generation_config.json, model.safetensors   the model as transformers saves it (fp32)
  tokens.bin        flat little-endian uint32, sample after sample, each sample seq_len + 1 tokens
                    (inputs: the first seq_len, targets: the last seq_len), exactly the samples the
                    training steps consume, in order
  expected.safetensors
                    "logits"        [micro_batch, seq_len, vocab] of the first micro-batch
                    "grad.<name>"   the gradient of every parameter (HF names) at step 1, i.e. what
                                    the optimizer sees before clipping: the sum over the step's
                                    micro-batches of grad(loss_micro / grad_accum_steps). For tied
                                    embeddings there is one tensor, grad.<embed_tokens>, holding
                                    the lookup and the LM-head contributions.
                    "rope.inv_freq" (Llama, Qwen2) the inverse frequencies after rope scaling
  expected.json     every hyperparameter, the losses, LRs and gradient norms per step, the
                    decay / no-decay parameter lists and the library versions

Training is the Hugging Face Trainer's step written out (the Trainer itself needs `accelerate`,
and writing the loop makes every detail visible): torch.optim.AdamW, the LR schedule of
transformers.get_linear_schedule_with_warmup, clipping with torch.nn.utils.clip_grad_norm_,
loss / grad_accum_steps per micro-batch. See expected.json["training"]["algorithm"].

Plus one directory, llama_gqa_tied_rope3_bf16_sharded/, the first model saved by transformers in
bf16 and sharded (model.safetensors.index.json), to test the loader on files transformers wrote.
"""
import argparse
import re
import json
import math
import os
import shutil
import struct
import sys

import torch

# Newest transformers whose Llama, OPT and optimization modules import with PyTorch 1.13: 4.48 imports
# torch.optim.lr_scheduler.LRScheduler (PyTorch >= 2.0) in transformers.optimization and 4.50 imports
# torch.distributed.tensor (PyTorch >= 2.5) in the models. 4.43+ has the Llama-3
# rope scaling ("rope_type": "llama3"). make_golden.sh installs this exact version.
TRANSFORMERS_VERSION = "4.47.1"

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from safetensors.torch import save_file  # noqa: E402

SEED = 1234


def llama_config(tied, rope_scaling):
    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0 if rope_scaling else 10000.0,
        rope_scaling=rope_scaling,
        tie_word_embeddings=tied,
        initializer_range=0.02,
        attention_dropout=0.0,
        hidden_act="silu",
        attn_implementation="eager",
        torch_dtype="float32",
    )


def opt_config(word_embed_proj_dim, do_layer_norm_before):
    return OPTConfig(
        vocab_size=256,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=word_embed_proj_dim,
        do_layer_norm_before=do_layer_norm_before,
        activation_function="relu",
        enable_bias=True,
        layer_norm_elementwise_affine=True,
        dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
        init_std=0.02,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
        tie_word_embeddings=True,
        attn_implementation="eager",
        torch_dtype="float32",
    )


def qwen2_config():
    """Qwen2 in small: GQA (4 heads, 2 KV heads), q/k/v biases, tied embeddings, rope_theta 1e6
    (Qwen2.5's), pad_token_id 1 (nn.Embedding's padding_idx, as in OPT's cases), no sliding window.
    head_dim is hidden_size / num_attention_heads (Qwen2 has no head_dim key)."""
    return Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        rope_scaling=None,
        tie_word_embeddings=True,
        use_sliding_window=False,
        max_window_layers=2,
        initializer_range=0.02,
        attention_dropout=0.0,
        hidden_act="silu",
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
        attn_implementation="eager",
        torch_dtype="float32",
    )


# Llama-3 rope scaling with original_max_position_embeddings small enough that, at head_dim 16 and
# rope_theta 500000, one frequency is kept (wavelength < 16), one is interpolated (16..64) and six
# are divided by the factor (wavelength > 64). make_case asserts that all three happen.
ROPE_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

COMMON_TRAINING = {
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
}

CASES = [
    {
        "name": "llama_gqa_tied_rope3",
        "description": "Llama, GQA (4 heads, 2 KV heads), llama3 rope scaling, tied embeddings",
        "config": lambda: llama_config(True, dict(ROPE_LLAMA3)),
        "family": "llama",
        "grad_accum_steps": 1,
        "max_grad_norm": 3.0,  # clips some steps with LR > 0 and not others
    },
    {
        "name": "llama_untied_accum2",
        "description": "Llama, GQA, no rope scaling, untied lm_head, gradient accumulation 2",
        "config": lambda: llama_config(False, None),
        "family": "llama",
        "grad_accum_steps": 2,
        "max_grad_norm": 3.0,  # clips some steps with LR > 0 and not others
    },
    {
        "name": "llama_untied_freeze",
        "description": "Llama as llama_untied_accum2 with embed_tokens and layer 0 frozen (requires_grad=False on "
        "the names scalelab train --freeze 'embed_tokens|layers\\.0\\.' matches)",
        "config": lambda: llama_config(False, None),
        "family": "llama",
        "grad_accum_steps": 2,
        "max_grad_norm": 2.5,  # clips some steps with LR > 0 and not others
        "freeze": r"embed_tokens|layers\.0\.",
    },
    {
        "name": "opt_tiny",
        "description": "OPT, do_layer_norm_before true, word_embed_proj_dim == hidden_size (opt-125m-like)",
        "config": lambda: opt_config(32, True),
        "family": "opt",
        "grad_accum_steps": 1,
        "max_grad_norm": 2.5,  # clips some steps with LR > 0 and not others
    },
    {
        "name": "opt_proj_postln_accum2",
        "description": "OPT, word_embed_proj_dim 16 != hidden 32 (project_in/out) and "
        "do_layer_norm_before false (opt-350m-like), gradient accumulation 2",
        "config": lambda: opt_config(16, False),
        "family": "opt",
        "grad_accum_steps": 2,
        "max_grad_norm": 0.5,  # clips some steps with LR > 0 and not others
    },
    {
        "name": "qwen2_gqa_tied_bias_accum2",
        "description": "Qwen2, GQA (4 heads, 2 KV heads), q/k/v biases (drawn non-zero), tied embeddings, "
        "pad_token_id 1, gradient accumulation 2",
        "config": qwen2_config,
        "family": "qwen2",
        "grad_accum_steps": 2,
        "max_grad_norm": 3.0,  # clips some steps with LR > 0 and not others
    },
]

MODEL_CLASSES = {"llama": LlamaForCausalLM, "opt": OPTForCausalLM, "qwen2": Qwen2ForCausalLM}


def make_tokens(gen, vocab, n_samples, seq_len):
    """Token streams a model can learn within a few steps, so that the loss trajectory moves far
    more than the comparison tolerance: ids from a pool of 24 (always including 1, OPT's
    padding_idx, and vocab - 1), following a fixed random successor table with 20% noise."""
    assert vocab > 24
    pool = torch.randperm(vocab - 2, generator=gen)[:22] + 2
    pool = torch.cat([torch.tensor([1, vocab - 1]), pool[pool != vocab - 1][:22]])
    succ = torch.randint(0, len(pool), (len(pool),), generator=gen)
    rows = []
    for s in range(n_samples):
        idx = [int(torch.randint(0, len(pool), (1,), generator=gen))]
        if s == 0:
            idx[0] = 0  # the first sample starts with token 1 (OPT's padding_idx) so step 1 sees it
        for _ in range(seq_len):
            if float(torch.rand(1, generator=gen)) < 0.2:
                idx.append(int(torch.randint(0, len(pool), (1,), generator=gen)))
            else:
                idx.append(int(succ[idx[-1]]))
        rows.append([int(pool[i]) for i in idx])
    return torch.tensor(rows, dtype=torch.int64)


def write_tokens(path, tokens):
    flat = tokens.reshape(-1).tolist()
    with open(path, "wb") as f:
        f.write(struct.pack("<%dI" % len(flat), *flat))


def no_decay(model):
    """Parameters without weight decay: biases and the weights of every norm layer (LayerNorm,
    LlamaRMSNorm), including Llama's final model.norm. This is the rule the HF Trainer states and
    later releases implement; transformers 4.47.1's Trainer excludes only nn.LayerNorm modules and
    names containing "bias", so it still decays Llama's RMSNorm weights. scalelab follows the rule
    as stated, and so does this golden data (expected.json lists both groups)."""
    names = set()
    for mod_name, mod in model.named_modules():
        is_norm = isinstance(mod, torch.nn.LayerNorm) or type(mod).__name__.endswith("RMSNorm")
        for p_name, _ in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if is_norm or p_name == "bias":
                names.add(full)
    return names


def cross_entropy(logits, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_case(case, out_root):
    torch.manual_seed(SEED)
    config = case["config"]()
    model = MODEL_CLASSES[case["family"]](config).float()
    if case["family"] == "qwen2":
        # transformers initializes biases to 0; non-zero ones make the forward depend on them.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("_proj.bias"):
                    p.normal_(0.0, 0.1)
    model.train()  # dropout is 0 everywhere, so train and eval modes compute the same
    frozen = []
    if case.get("freeze"):
        # --freeze REGEX: std::regex ECMAScript regex_search on the HF names = Python re.search.
        for name, p in model.named_parameters():
            if re.search(case["freeze"], name):
                p.requires_grad_(False)
                frozen.append(name)
        assert frozen, f"{case['name']}: freeze matches nothing"

    t = dict(COMMON_TRAINING)
    t["grad_accum_steps"] = case["grad_accum_steps"]
    t["max_grad_norm"] = case["max_grad_norm"]
    if case.get("freeze"):
        t["freeze"] = case["freeze"]
    mb, seq, steps, accum = t["micro_batch_size"], t["seq_len"], t["max_steps"], t["grad_accum_steps"]

    out = os.path.join(out_root, case["name"])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    model.save_pretrained(out, safe_serialization=True)

    gen = torch.Generator().manual_seed(SEED + 1)
    tokens = make_tokens(gen, config.vocab_size, steps * accum * mb, seq)
    write_tokens(os.path.join(out, "tokens.bin"), tokens)

    named = dict(model.named_parameters())  # tied weights appear once, under the embedding's name
    named_trainable = {n: p for n, p in named.items() if p.requires_grad}
    # What the loader must find in model.safetensors, checked from C++ without a safetensors reader
    # of its own: the first values (exact float32, as doubles) and the fp64 sum of every parameter.
    initial_params = {
        n: {"first": [float(v) for v in p.detach().reshape(-1)[:4]], "sum": float(p.detach().double().sum()),
            "shape": list(p.shape)}
        for n, p in named.items()
    }
    nd = no_decay(model)
    # The optimizer (and its groups) hold the trainable parameters only; frozen ones get no state.
    decay_names = [n for n in named_trainable if n not in nd]
    no_decay_names = [n for n in named_trainable if n in nd]
    optimizer = torch.optim.AdamW(
        [
            {"params": [named[n] for n in decay_names], "weight_decay": t["weight_decay"]},
            {"params": [named[n] for n in no_decay_names], "weight_decay": 0.0},
        ],
        lr=t["lr"],
        betas=(t["adam_beta1"], t["adam_beta2"]),
        eps=t["adam_epsilon"],
    )
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, t["warmup_steps"], steps)

    expected = {}
    losses, lrs, grad_norms, micro_losses = [], [], [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        step_micro = []
        for k in range(accum):
            i0 = (step * accum + k) * mb
            batch = tokens[i0 : i0 + mb]
            inputs, targets = batch[:, :seq], batch[:, 1:]
            logits = model(input_ids=inputs).logits
            loss = cross_entropy(logits, targets)
            (loss / accum).backward()
            step_micro.append(loss.item())
            if step == 0 and k == 0:
                expected["logits"] = logits.detach().clone()
        if step == 0:
            for n, p in named_trainable.items():  # frozen parameters have no gradient
                expected["grad." + n] = p.grad.detach().clone()
        lrs.append(optimizer.param_groups[0]["lr"])
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["max_grad_norm"])
        grad_norms.append(float(norm))
        optimizer.step()
        scheduler.step()
        losses.append(sum(step_micro) / accum)
        micro_losses.append(step_micro)

    clipped = [g > t["max_grad_norm"] for g in grad_norms]
    effective = [c for c, lr in zip(clipped, lrs) if lr > 0]
    assert any(effective), f"{case['name']}: max_grad_norm never clips a step with LR > 0 ({grad_norms})"
    assert not all(effective), f"{case['name']}: max_grad_norm clips every step ({grad_norms})"
    margin = min(abs(g - t["max_grad_norm"]) / t["max_grad_norm"] for g in grad_norms)
    assert margin > 0.02, f"{case['name']}: a gradient norm is within 2% of max_grad_norm ({grad_norms})"
    assert losses[-1] < losses[0] - 0.2, f"{case['name']}: the loss trajectory barely moves ({losses})"
    assert losses[-1] < losses[0], f"{case['name']}: the loss did not move ({losses})"

    if case["family"] in ("llama", "qwen2"):
        inv_freq = model.model.rotary_emb.inv_freq.detach().clone().float()
        expected["rope.inv_freq"] = inv_freq
        if config.rope_scaling:
            head = config.head_dim
            base = 1.0 / (config.rope_theta ** (torch.arange(0, head, 2, dtype=torch.int64).float() / head))
            ratio = (base / inv_freq).tolist()
            f = config.rope_scaling["factor"]
            kinds = {"kept": sum(abs(r - 1) < 1e-6 for r in ratio), "divided": sum(abs(r - f) < 1e-4 for r in ratio)}
            kinds["interpolated"] = len(ratio) - kinds["kept"] - kinds["divided"]
            assert all(v > 0 for v in kinds.values()), f"rope scaling does not exercise every branch: {kinds}"
    if case["family"] in ("opt", "qwen2"):
        pad = config.pad_token_id
        assert (tokens[:mb, :seq] == pad).any(), "no padding_idx token in the inputs of the first micro-batch"

    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(out, "expected.safetensors"),
              metadata={"format": "pt"})

    final_stats = {
        n: {"sum": float(p.detach().double().sum()), "sum_sq": float(p.detach().double().pow(2).sum())}
        for n, p in named.items()
    }
    training = dict(t)
    training.update(
        {
            "num_samples": int(tokens.shape[0]),
            "samples_per_step": mb * accum,
            "dropout": 0.0,
            "lr_schedule": "transformers.get_linear_schedule_with_warmup(num_warmup_steps=warmup_steps, "
            "num_training_steps=max_steps): lr(step) = lr * (step / max(1, warmup_steps) if step < warmup_steps "
            "else max(0, (max_steps - step) / max(1, max_steps - warmup_steps))), step counted from 0, so the "
            "first update has LR 0",
            "algorithm": [
                "for step in 0..max_steps-1:",
                "  micro-batch k in 0..grad_accum_steps-1 takes samples (step*grad_accum_steps + k)*micro_batch_size "
                "onward from tokens.bin; inputs = sample[:seq_len], targets = sample[1:]",
                "  loss_k = mean cross-entropy over micro_batch_size*seq_len targets; grads += d(loss_k / grad_accum_steps)",
                "  losses[step] = mean of loss_k (computed before this step's update)",
                "  total_norm = sqrt(sum of squared grads over all parameters) (torch.nn.utils.clip_grad_norm_, "
                "norm_type 2); grad_norms[step] = total_norm before clipping",
                "  clip_coef = min(1, max_grad_norm / (total_norm + 1e-6)); grads *= clip_coef "
                "(torch 1.13 always multiplies by the clamped coefficient)",
                "  torch.optim.AdamW (step t = step + 1, lr = lrs[step]): p *= 1 - lr*weight_decay (decay group only); "
                "m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; "
                "p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)",
                "  (tied embeddings are one parameter: its gradient is the sum of the lookup and LM-head parts)",
            ],
        }
    )
    if case["family"] in ("opt", "qwen2"):
        training["embedding_padding_idx"] = config.pad_token_id
        training["note_padding_idx"] = (
            f"{ {'opt': 'OPT', 'qwen2': 'Qwen2'}[case['family']] }'s embed_tokens is nn.Embedding(padding_idx=pad_token_id=1): lookups of token 1 "
            "contribute no gradient to row 1 (the tied LM head still does). tokens.bin contains token 1 among the "
            "inputs."
        )

    record = {
        "case": case["name"],
        "description": case["description"],
        "family": case["family"],
        "model_config_file": "config.json",
        "training": training,
        "decay_params": decay_names,
        "no_decay_params": no_decay_names,
        "frozen_params": frozen,
        "tied_params": {"lm_head.weight": [n for n in named if n.endswith("embed_tokens.weight")][0]}
        if config.tie_word_embeddings
        else {},
        "first_microbatch_loss": micro_losses[0][0],
        "losses": losses,
        "microbatch_losses": micro_losses,
        "lrs": lrs,
        "grad_norms": grad_norms,
        "clipped": clipped,
        "final_param_stats": final_stats,
        "initial_params": initial_params,
        "tolerances_suggested": {"loss_rel": 1e-5, "grad_abs": 1e-4, "trajectory_rel": 1e-3},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
        "seed": SEED,
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{case['name']}: losses {[round(l, 5) for l in losses]} grad_norms {[round(g, 4) for g in grad_norms]}")
    return model


def make_bf16_sharded(out_root):
    """The first case's initial weights, saved by transformers in bf16 and sharded."""
    case = CASES[0]
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(case["config"]()).float()
    out = os.path.join(out_root, case["name"] + "_bf16_sharded")
    if os.path.exists(out):
        shutil.rmtree(out)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, max_shard_size="64KB")
    assert os.path.exists(os.path.join(out, "model.safetensors.index.json")), "transformers did not shard"
    print(f"{os.path.basename(out)}: {sorted(os.listdir(out))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    ap.add_argument("--cases", nargs="*", metavar="NAME",
                    help="regenerate only these cases (default: all, and the bf16 sharded directory)")
    args = ap.parse_args()
    known = [c["name"] for c in CASES]
    for name in args.cases or []:
        if name not in known:
            sys.exit(f"make_golden.py: unknown case {name!r}; known: {', '.join(known)}")
    if transformers.__version__ != TRANSFORMERS_VERSION:
        sys.exit(f"make_golden.py: transformers {transformers.__version__} found, {TRANSFORMERS_VERSION} required — "
                 "run tests/golden/make_golden.sh, which installs it")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    for case in CASES:
        if not args.cases or case["name"] in args.cases:
            make_case(case, args.out)
    if not args.cases:
        make_bf16_sharded(args.out)


if __name__ == "__main__":
    main()
