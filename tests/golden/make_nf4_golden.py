#!/usr/bin/env python3
"""Golden data for QLoRA's NF4 base (scalelab train --quantize-base nf4|nf4-bnb).

Run it with make_nf4_golden.sh: a virtualenv with the PyPI packages pinned in
requirements-nf4.txt (PyTorch for the CPU, torchao, bitsandbytes, transformers). The output under
tests/golden/data/nf4/ is committed so that CI needs none of them.

  quantize.safetensors   20 tensors ("case<i>.input", fp32) and what each reference makes of them:
                         torchao's to_nf4 (block 64, scaler block 256): case<i>.torchao.codes (U8,
                         packed), .scalers (I8), .factors (F32, quantization_factor), .mean (F32[1]),
                         .absmax (F32, dequantize_scalers) and, for cases 0 and 4, .dequant (F32,
                         get_original_weight; for every case the generator asserts that it equals
                         table[code] · absmax element by element, which the test checks for all);
                         bitsandbytes' quantize_4bit(nf4, blocksize 64, compress_statistics=True) on
                         the CPU: case<i>.bnb.codes, .scalers (U8, state.absmax), .factors (F32,
                         state2.absmax), .mean (F32[1], state.offset), .absmax (F32, the dequantized
                         absmax) and .dequant (F32, dequantize_4bit); "bnb.dynamic_map" (state2.code).
                         A reference that refuses a tensor (torchao: numel not a multiple of
                         64·256) has no entries for it.
  quantize.json          per case: name, shape, what it exercises
  sums.json              torch.sum of fp32 vectors made by a formula (the same in the test) of many
                         lengths: the reduction order torchao's and bitsandbytes' means use
  qlora/                 QLoRA trajectories: a tiny Llama (config.json + model.safetensors, fp32),
                         tokens.bin, adapter_init/ (PEFT format; the same A and B for both
                         flavours), expected_<flavor>.json with per-step losses and
                         adapter_final_<flavor>/. The model is transformers' Llama with every projection of every
                         layer replaced by torchtune's QLoRA linear: the base weight an NF4 tensor
                         (torchao's NF4Tensor, or bitsandbytes' quantize_4bit for nf4-bnb), forward
                         F.linear(x, dequantized W) + s·B(A(x)), only A and B train (AdamW, warmup,
                         linear decay, weight decay, clipping at 1.0 as the HF Trainer).
"""
import argparse
import json
import os
import shutil
import struct

import bitsandbytes as bnb
import bitsandbytes.functional as bnbf
import numpy as np
import safetensors.torch
import torch
import torchao
import transformers
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1414
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
# torchao's NF4Tensor.from_tensor writes the table to four decimals.
NF4_TORCHAO = [-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796, 0.1609, 0.2461, 0.3379,
               0.4407, 0.5626, 0.7230, 1.0]


# ------------------------------------------------------------------ the 20 quantization cases

def midpoint_block(gen, n):
    """Values at the fp32 midpoints between adjacent NF4 values times a block absmax of 1 (and
    scaled copies): the ties where torchao's argmin (first of equal distances) and bitsandbytes'
    bucketize (x <= midpoint goes down) may differ, plus values one ulp either side."""
    t = torch.cat([torch.tensor(NF4, dtype=torch.float32), torch.tensor(NF4_TORCHAO, dtype=torch.float32)])
    mids = torch.cat([(t[:15] + t[1:16]) / 2, (t[16:31] + t[17:32]) / 2])
    vals = torch.cat([mids, torch.nextafter(mids, torch.full_like(mids, 2.0)),
                      torch.nextafter(mids, torch.full_like(mids, -2.0)), t])
    out = vals[torch.randint(0, len(vals), (n,), generator=gen)]
    out = out.reshape(-1, 64)
    out[:, 0] = 1.0  # every block's absmax is exactly 1, so x / absmax is x
    return out.reshape(-1)


def cases():
    g = torch.Generator().manual_seed(SEED)
    c = []

    def add(name, x, what):
        c.append((name, x.to(torch.float32).contiguous(), what))

    add("normal_128x128", torch.randn(128, 128, generator=g) * 0.02, "a typical weight: N(0, 0.02)")
    add("normal_256x128", torch.randn(256, 128, generator=g), "N(0, 1)")
    add("uniform_128x256", torch.rand(128, 256, generator=g) * 2 - 1, "U(-1, 1)")
    add("heavy_tail_64x512", torch.randn(64, 512, generator=g) ** 3, "heavy tails (cubed normal)")
    add("midpoint_ties_128x128", midpoint_block(g, 128 * 128).reshape(128, 128), "exact NF4 midpoints and their neighbours")
    x = torch.randn(128, 128, generator=g)
    x.view(-1, 64)[::3] = 0.0
    add("zero_blocks_128x128", x, "every third block all zeros")
    add("all_zero_128x128", torch.zeros(128, 128), "all zeros (every absmax 0)")
    x = torch.randn(256, 64, generator=g)
    x.view(-1, 64)[5] = 0.0
    x.view(-1, 64)[200] = 0.0
    add("two_zero_blocks_256x64", x, "two all-zero blocks")
    add("positive_128x128", torch.rand(128, 128, generator=g), "non-negative values only")
    add("negative_128x128", -torch.rand(128, 128, generator=g), "non-positive values only")
    x = torch.randn(128, 128, generator=g)
    x.view(-1)[::97] *= 1000.0
    add("outliers_128x128", x, "outliers every 97 elements")
    add("tiny_128x128", torch.randn(128, 128, generator=g) * 1e-30, "tiny magnitudes (1e-30)")
    add("constant_128x128", torch.full((128, 128), 0.375), "one value everywhere (every absmax equal)")
    x = torch.randn(128, 128, generator=g)
    x.view(-1, 64)[:, 0] = x.view(-1, 64).abs().max(dim=1).values * -1.0
    add("negative_absmax_128x128", x, "each block's absmax element negative")
    add("scaled_rows_64x256", torch.randn(64, 256, generator=g) * torch.logspace(-3, 3, 64).unsqueeze(1),
        "rows scaled over six decades (scalers spread)")
    add("normal_512x128", torch.randn(512, 128, generator=g) * 0.05, "1024 blocks (4 scaler blocks)")
    add("normal_1024x128", torch.randn(1024, 128, generator=g) * 0.05, "2048 blocks (8 scaler blocks)")
    add("halves_128x128", (torch.randint(-8, 9, (128, 128), generator=g) / 8.0), "multiples of 1/8 (many exact ties)")
    add("odd_rows_100x96", torch.randn(100, 96, generator=g), "9600 elements: 150 blocks (bitsandbytes only)")
    add("odd_numel_37x53", torch.randn(37, 53, generator=g), "1961 elements: a partial block (bitsandbytes only)")
    return c


def torchao_quantize(x):
    if x.numel() % (64 * 256) != 0:
        return None
    t = to_nf4(x, 64, 256)
    dq = t.get_original_weight()
    absmax = t.dequantize_scalers(t.quantized_scalers, t.quantization_factor, t.scaler_block_size)
    # The dequantization is the table value times the block's dequantized absmax, element by element.
    codes = t.quantized_data
    idx = torch.stack([(codes >> 4).long(), (codes & 15).long()], dim=1).reshape(-1)
    formula = torch.tensor(NF4_TORCHAO, dtype=torch.float32)[idx] * absmax.repeat_interleave(64)
    assert torch.equal(formula.view(torch.int32), dq.reshape(-1).view(torch.int32)), "torchao dequant formula"
    return {"codes": codes.contiguous(), "scalers": t.quantized_scalers.contiguous(),
            "factors": t.quantization_factor.float().contiguous(), "mean": t.scaler_mean.reshape(1).float(),
            "absmax": absmax.float().contiguous(), "dequant": dq.float().contiguous()}


def bnb_quantize(x):
    packed, state = bnbf.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
    dq = bnbf.dequantize_4bit(packed, state)
    absmax = bnbf.dequantize_blockwise(state.absmax, state.state2) + state.offset
    codes = packed.reshape(-1)
    idx = torch.stack([(codes >> 4).long(), (codes & 15).long()], dim=1).reshape(-1)[:x.numel()]
    formula = torch.tensor(NF4, dtype=torch.float32)[idx] * absmax.repeat_interleave(64)[:x.numel()]
    # bitsandbytes' native CPU dequantization (rows of an even length) blocks each row on its own,
    # which differs from its quantization's blocks over the flattened tensor when the row length is
    # not a multiple of 64; the generic path (odd row lengths) and CUDA follow the flattened blocks.
    # Recorded, not asserted: scalelab dequantizes by the flattened blocks, as bitsandbytes quantizes.
    consistent = torch.equal(formula.view(torch.int32), dq.reshape(-1).view(torch.int32))
    assert consistent or x.shape[-1] % 64 != 0, "bitsandbytes dequant formula"
    return {"consistent": consistent,"codes": packed.reshape(-1).contiguous(), "scalers": state.absmax.contiguous(),
            "factors": state.state2.absmax.float().contiguous(), "mean": state.offset.reshape(1).float(),
            "absmax": absmax.float().contiguous(), "dequant": dq.float().contiguous(),
            "dynamic_map": state.state2.code.float().contiguous()}


def write_quantize(out):
    tensors, meta = {}, []
    dyn = None
    for i, (name, x, what) in enumerate(cases()):
        tensors[f"case{i}.input"] = x
        entry = {"name": name, "shape": list(x.shape), "what": what, "flavors": []}
        for flavor, fn in (("torchao", torchao_quantize), ("bnb", bnb_quantize)):
            r = fn(x)
            if r is None:
                continue
            consistent = r.pop("consistent", True)
            if not consistent:
                entry["bnb_native_dequant_differs"] = True
            if i not in (0, 4) and consistent:  # the full dequantization of two cases; the others by formula
                del r["dequant"]
            entry["flavors"].append(flavor)
            if "dynamic_map" in r:
                m = r.pop("dynamic_map")
                assert dyn is None or torch.equal(dyn, m)
                dyn = m
            for k, v in r.items():
                tensors[f"case{i}.{flavor}.{k}"] = v
        meta.append(entry)
    tensors["bnb.dynamic_map"] = dyn
    safetensors.torch.save_file(tensors, os.path.join(out, "quantize.safetensors"))
    with open(os.path.join(out, "quantize.json"), "w") as f:
        json.dump({"cases": meta, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                   "versions": versions()}, f, indent=1)


def formula_vector(n, salt):
    """x_i = float32(uint32((i + salt) · 2654435761)) · 2^-32 − 0.5 (fp32), the same in the test."""
    i = np.arange(n, dtype=np.uint64) + np.uint64(salt)
    u = ((i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return (u.astype(np.float32) * np.float32(2.0 ** -32) - np.float32(0.5)).astype(np.float32)


def write_sums(out):
    rows = []
    for n in [1, 5, 8, 9, 31, 32, 33, 63, 64, 100, 255, 256, 257, 1000, 1024, 4095, 4096, 4097, 10000, 16384, 32767]:
        for salt in (0, 7):
            v = torch.from_numpy(formula_vector(n, salt))
            s = v.sum()
            m = v.mean()
            rows.append({"n": n, "salt": salt, "sum_bits": int(s.view(torch.int32)), "mean_bits": int(m.view(torch.int32))})
    with open(os.path.join(out, "sums.json"), "w") as f:
        json.dump({"sums": rows, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": 1}, f, indent=1)


# ------------------------------------------------------------------ the QLoRA trajectory

TRAINING = {"micro_batch_size": 2, "seq_len": 16, "max_steps": 5, "warmup_steps": 1, "lr": 1e-2,
            "lr_scheduler": "linear", "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.999,
            "adam_epsilon": 1e-8, "max_grad_norm": 1.0, "grad_accum_steps": 1}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 8, 16.0


class BnbNf4Weight(torch.autograd.Function):
    """F.linear with bitsandbytes' dequantized weight (frozen: no weight gradient)."""

    @staticmethod
    def forward(ctx, x, packed, state):
        w = bnbf.dequantize_4bit(packed, state)
        ctx.save_for_backward(packed)
        ctx.state = state
        return torch.nn.functional.linear(x, w)

    @staticmethod
    def backward(ctx, g):
        (packed,) = ctx.saved_tensors
        return g @ bnbf.dequantize_4bit(packed, ctx.state), None, None


class QLoraLinear(torch.nn.Module):
    """torchtune's LoRALinear with quantize_base: the frozen base in NF4, the adapters in fp32."""

    def __init__(self, linear, flavor, r, alpha):
        super().__init__()
        self.flavor = flavor
        w = linear.weight.detach().float()
        if flavor == "nf4":
            self.weight = torch.nn.Parameter(to_nf4(w, 64, 256), requires_grad=False)
        else:
            self.packed, self.state = bnbf.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        self.lora_A = torch.nn.Linear(w.shape[1], r, bias=False)
        self.lora_B = torch.nn.Linear(r, w.shape[0], bias=False)
        torch.nn.init.kaiming_uniform_(self.lora_A.weight, a=5 ** 0.5)  # peft's / torchtune's init
        torch.nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / r

    def forward(self, x):
        if self.flavor == "nf4":
            base = linear_nf4(input=x, weight=self.weight)
        else:
            base = BnbNf4Weight.apply(x, self.packed, self.state)
        return base + self.scale * self.lora_B(self.lora_A(x))


def make_tokens(gen, vocab, n_samples, seq_len):
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


def write_qlora(out_root, flavor):
    torch.manual_seed(SEED)
    # Every projection's numel a multiple of 64·256 (torchao's requirement): hidden 128, 4 heads of 32.
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=128,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.02,
                         attention_dropout=0.0, hidden_act="silu", attn_implementation="eager", torch_dtype="float32")
    model = LlamaForCausalLM(config).float()
    out = os.path.join(out_root, "qlora")
    first = flavor == "nf4"
    if first:
        if os.path.exists(out):
            shutil.rmtree(out)
        os.makedirs(out)
        model.save_pretrained(out, safe_serialization=True)
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = {}
    for li, layer in enumerate(model.model.layers):
        for parent, names in ((layer.self_attn, ["q_proj", "k_proj", "v_proj", "o_proj"]),
                              (layer.mlp, ["gate_proj", "up_proj", "down_proj"])):
            for n in names:
                q = QLoraLinear(getattr(parent, n), "nf4" if flavor == "nf4" else "bnb", RANK, ALPHA)
                setattr(parent, n, q)
                path = f"base_model.model.model.layers.{li}.{'self_attn' if parent is layer.self_attn else 'mlp'}.{n}"
                adapters[path] = q
    model.train()

    def save_adapter(d):
        os.makedirs(d, exist_ok=True)
        t = {}
        for path, q in adapters.items():
            t[f"{path}.lora_A.weight"] = q.lora_A.weight.detach().clone().contiguous()
            t[f"{path}.lora_B.weight"] = q.lora_B.weight.detach().clone().contiguous()
        safetensors.torch.save_file(t, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
                       "lora_dropout": 0.0, "target_modules": TARGETS, "use_rslora": False, "bias": "none",
                       "base_model_name_or_path": None}, f, indent=2)

    if first:
        save_adapter(os.path.join(out, "adapter_init"))
    else:  # the same seed gives the same model and the same A and B
        ref = safetensors.torch.load_file(os.path.join(out, "adapter_init", "adapter_model.safetensors"))
        for path, q in adapters.items():
            assert torch.equal(ref[f"{path}.lora_A.weight"], q.lora_A.weight)
    t = dict(TRAINING)
    mb, seq, steps = t["micro_batch_size"], t["seq_len"], t["max_steps"]
    gen = torch.Generator().manual_seed(SEED + 1)
    tokens = make_tokens(gen, config.vocab_size, steps * mb, seq)
    flat = tokens.reshape(-1).tolist()
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dI" % len(flat), *flat))
    flavor_tag = flavor.replace("-", "_")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) == 2 * len(adapters)
    optimizer = torch.optim.AdamW(trainable, lr=t["lr"], betas=(t["adam_beta1"], t["adam_beta2"]),
                                  eps=t["adam_epsilon"], weight_decay=t["weight_decay"])
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, t["warmup_steps"], steps)
    losses, norms = [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        batch = tokens[step * mb:(step + 1) * mb]
        logits = model(input_ids=batch[:, :seq]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(trainable, t["max_grad_norm"])))
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, f"{flavor}: the loss barely moves ({losses})"
    save_adapter(os.path.join(out, f"adapter_final_{flavor_tag}"))
    with open(os.path.join(out, f"expected_{flavor_tag}.json"), "w") as f:
        json.dump({"flavor": flavor, "lora": {"r": RANK, "alpha": ALPHA, "targets": TARGETS}, "training": t,
                   "losses": losses, "grad_norms": norms, "versions": versions()}, f, indent=2)
    print(f"qlora {flavor}: losses {['%.5f' % x for x in losses]}")


def versions():
    return {"torch": torch.__version__, "torchao": torchao.__version__, "bitsandbytes": bnb.__version__,
            "transformers": transformers.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    write_quantize(a.out)
    write_sums(a.out)
    for flavor in ("nf4", "nf4-bnb"):
        write_qlora(a.out, flavor)


if __name__ == "__main__":
    main()
