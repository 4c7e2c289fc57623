#!/usr/bin/env python3
"""Golden data for quantization-aware training (scalelab train --qat 8da4w, scalelab quantize).

Run it with make_qat_golden.sh: a virtualenv with the PyPI packages pinned in requirements-qat.txt
(PyTorch for the CPU, torchao, transformers). The output under tests/golden/data/qat/ is committed
so that CI needs none of them.

kernels.safetensors (fp32 unless said otherwise), from torchao's Int8DynActInt4WeightQATLinear
(in 64, out 16, groupsize 32) — the fake quantizers that linear applies:
  x [8, 64]        activations: rows of different ranges, an all-zero row, an all-positive and an
                   all-negative row, a row whose values are exact half-integers with scale 1 (ties)
  fq_x             activation_fake_quantizer(x): int8 per-token asymmetric
  g_x, ste_x       an upstream gradient and x.grad through the activation fake quantizer
  w [16, 64]       weights: random groups, an all-zero group, groups of exact half-integers with
                   amax 7.5 (scale 1: ties, and +7.5 that rounds to 8 and is clamped), ...
  fq_w             weight_fake_quantizer(w): int4 per-group symmetric
  g_w, ste_w       an upstream gradient and w.grad through the weight fake quantizer
  dy, y, dx, dw    the whole linear: y = linear(x), y.backward(dy): x.grad, weight.grad

kernels_lowp.safetensors: torchao's fake quantizers of Int8DynActInt4WeightQATLinear on bf16 and
fp16 tensors (the quantizer computes in its input's dtype: kernels/qat.h has the op sequence), for
each dtype D in bf16, fp16 (every tensor of dtype D unless said otherwise):
  D.aK.x, D.aK.fq, D.aK.g, D.aK.ste      activation case K: x [rows, cols], fq(x), an upstream
                                         gradient and x.grad — rows of different ranges, all-zero,
                                         all-positive, all-negative, ties at scale 1 (hi − lo = 255)
  D.wK.w, D.wK.fq, D.wK.g, D.wK.ste      weight case K: w [out, in], fq(w), a gradient and w.grad
  D.wK.group (I32 [1])                   its group size; groups of ties (amax 7.5: scale 1, +7.5
                                         clamped), all-zero groups, groups whose scale falls under
                                         the dtype's smallest normal (clamped), random groups
  D.wK.q (I8), D.wK.scales, D.wK.zeros   quantizer.convert of a D model holding w: the int4 values
                                         and the fp32 scales / zeros (scalelab quantize of a D
                                         checkpoint must equal them)
  bf16.linear.y, .dy, .dx, .dw            the whole Int8DynActInt4WeightQATLinear(64, 16, group 32) of a
                                         bf16 model on bf16.a0.x with weight bf16.w0.w: y, an upstream
                                         gradient, x.grad and weight.grad (bf16 GEMMs: a tolerance)
The cases of kernels.safetensors (fp32) are not repeated here.

trajectory/: a tiny Llama (GQA, tied embeddings), base model as transformers saves it
(config.json, model.safetensors) and tokens.bin (flat little-endian uint32, seq_len + 1 per sample,
in the order the steps consume them); torchao's quantizer.prepare on model.model.layers (every
linear module of the decoder layers; the tied LM head stays full precision, as scalelab's --qat),
then the Hugging Face Trainer's step written out (AdamW with decay on every non-norm weight, linear
schedule with warmup, clip_grad_norm_) for max_steps steps; expected.json has the per-step losses
and gradient norms, and "ulp_spread": the relative loss difference per step of the same run from
weights one ulp away (the reference's own sensitivity, from which the test's tolerance comes).
trained/: the trained model (config.json, model.safetensors: float weights, as QAT leaves them).
converted.safetensors: quantizer.convert of the trained model's layers: for each module
  "<module>.weight" int8 [out, in] (the int4 values), "<module>.scales" fp32 [out, in / G],
  "<module>.zeros" fp32 [out, in / G] — what scalelab quantize trained/ --to int4 must equal.
"""
import argparse
import json
import os
import shutil
import struct

import torch
import torchao
import transformers
from safetensors.torch import save_file
from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer
from torchao.quantization.qat.linear import Int8DynActInt4WeightQATLinear
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 1717
GROUP = 32

TRAINING = {
    "micro_batch_size": 2,
    "seq_len": 16,
    "max_steps": 6,
    "warmup_steps": 2,
    "lr": 3e-3,
    "lr_scheduler": "linear",
    "weight_decay": 0.1,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "max_grad_norm": 1.0,
    "grad_accum_steps": 1,
}


def kernel_inputs(gen):
    x = torch.randn(8, 64, generator=gen)
    x[0] = 0.0
    x[1] = x[1].abs() + 0.1
    x[2] = -(x[2].abs() + 0.1)
    x[3] *= 100.0
    x[4] *= 1e-3
    # scale exactly 1 (hi − lo = 255), zero point −64, values on exact halves: round-half-even ties
    halves = torch.arange(-64, 192, 4, dtype=torch.float32)[:62] + 0.5
    x[5] = torch.cat([torch.tensor([-64.0, 191.0]), halves])
    x[6] = torch.randn(64, generator=gen) * 3 + 5  # mostly positive, shifted
    w = torch.randn(16, 64, generator=gen) * 0.05
    w[0, :GROUP] = 0.0
    # amax 7.5 → scale 1: exact halves tie (to even), +7.5 rounds to 8 and is clamped (no gradient)
    ties = torch.cat([torch.arange(-7.5, 8.0, 0.5), torch.tensor([0.0])])
    assert ties.numel() == GROUP
    w[1, :GROUP] = ties
    w[1, GROUP:] = -ties
    w[2] *= 100.0
    w[3] *= 1e-4
    w[4, GROUP:] = w[4, GROUP:].abs()
    return x, w


def make_kernels(out):
    gen = torch.Generator().manual_seed(SEED)
    x, w = kernel_inputs(gen)
    lin = Int8DynActInt4WeightQATLinear(64, 16, bias=False, groupsize=GROUP)
    with torch.no_grad():
        lin.weight.copy_(w)
    xr = x.clone().requires_grad_(True)
    fq_x = lin.activation_fake_quantizer(xr)
    g_x = torch.randn(fq_x.shape, generator=gen)
    fq_x.backward(g_x)
    wr = w.clone().requires_grad_(True)
    fq_w = lin.weight_fake_quantizer(wr)
    g_w = torch.randn(fq_w.shape, generator=gen)
    fq_w.backward(g_w)
    xl = x.clone().requires_grad_(True)
    y = lin(xl)
    dy = torch.randn(y.shape, generator=gen)
    y.backward(dy)
    t = {"x": x, "fq_x": fq_x.detach(), "g_x": g_x, "ste_x": xr.grad, "w": w, "fq_w": fq_w.detach(), "g_w": g_w,
         "ste_w": wr.grad, "y": y.detach(), "dy": dy, "dx": xl.grad, "dw": lin.weight.grad}
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, "kernels.safetensors"))
    clamped = int((wr.grad == 0).sum()) - int((g_w == 0).sum())
    print(f"kernels: {clamped} clamped weight elements, fq_x levels/row {[len(r.unique()) for r in fq_x.detach()]}")


# (rows, cols) of the activation cases and (out, in, group) of the weight cases of kernels_lowp.
LOWP_ACTS = [(8, 64), (5, 200), (32, 128)]
LOWP_WEIGHTS = [(16, 64, 32), (6, 96, 8), (4, 256, 256), (32, 128, 32), (8, 128, 16)]


def lowp_activation(gen, rows, cols, case):
    x = torch.randn(rows, cols, generator=gen) * (10.0 ** (case - 1))
    if rows >= 8:
        x[0] = 0.0
        x[1] = x[1].abs() + 0.1
        x[2] = -(x[2].abs() + 0.1)
        x[3] *= 100.0
        x[4] *= 1e-3
        # scale exactly 1 in bf16 and fp16 (hi − lo = 255), zero point −64, values on exact halves
        # below 128 (exact in bf16's 8 significant bits): round-half-even ties
        halves = torch.arange(-64, 127, 1, dtype=torch.float32) + 0.5
        pick = torch.randint(0, len(halves), (cols - 2,), generator=gen)
        x[5] = torch.cat([torch.tensor([-64.0, 191.0]), halves[pick]])
        x[6] = torch.randn(cols, generator=gen) * 3 + 5
    return x


def lowp_weight(gen, out, cols, group, dtype):
    w = torch.randn(out, cols, generator=gen) * 0.05
    groups = cols // group
    ties = torch.arange(-7.5, 8.0, 0.5)  # 31 values, amax 7.5: scale 1
    for r in range(out):
        for k in range(groups):
            g = slice(k * group, (k + 1) * group)
            kind = (r * groups + k) % 6
            if kind == 0 and r == 0:
                w[r, g] = 0.0
            elif kind == 1:
                idx = torch.randint(0, len(ties), (group,), generator=gen)
                v = ties[idx]
                v[0] = 7.5 if (r + k) % 2 else -7.5  # the scale is 1 either way
                w[r, g] = v
            elif kind == 2:
                w[r, g] *= 100.0
            elif kind == 3:
                # a scale below the dtype's smallest normal, clamped to it (bf16: 2^-126, fp16: 2^-14)
                w[r, g] *= 1e-38 * 20 if dtype == torch.bfloat16 else 1e-3
            elif kind == 4:
                w[r, g] = w[r, g].abs()
    return w


def make_kernels_lowp(out):
    """torchao's fake quantizers (and convert) on bf16 and fp16 tensors."""
    from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer as Quantizer
    gen = torch.Generator().manual_seed(SEED + 7)
    t = {}
    counts = []
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for k, (rows, cols) in enumerate(LOWP_ACTS):
            lin = Int8DynActInt4WeightQATLinear(cols, 8, bias=False, groupsize=cols)
            x = lowp_activation(gen, rows, cols, k).to(dtype)
            xr = x.clone().requires_grad_(True)
            fq = lin.activation_fake_quantizer(xr)
            g = torch.randn(fq.shape, generator=gen).to(dtype)
            fq.backward(g)
            assert fq.dtype == dtype and xr.grad.dtype == dtype
            # what scalelab did before (fp32 arithmetic, one rounding): how many elements differ
            f32 = lin.activation_fake_quantizer(x.float()).to(dtype)
            counts.append(f"{name}.a{k}: {int((f32 != fq.detach()).sum())}/{fq.numel()}")
            p = f"{name}.a{k}."
            t.update({p + "x": x, p + "fq": fq.detach(), p + "g": g, p + "ste": xr.grad})
        for k, (rows, cols, group) in enumerate(LOWP_WEIGHTS):
            w = lowp_weight(gen, rows, cols, group, dtype).to(dtype)
            lin = Int8DynActInt4WeightQATLinear(cols, rows, bias=False, groupsize=group, precision=dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
            wr = w.clone().requires_grad_(True)
            fq = lin.weight_fake_quantizer(wr)
            g = torch.randn(fq.shape, generator=gen).to(dtype)
            fq.backward(g)
            assert fq.dtype == dtype and wr.grad.dtype == dtype
            f32 = lin.weight_fake_quantizer(w.float()).to(dtype)
            counts.append(f"{name}.w{k}: {int((f32 != fq.detach()).sum())}/{fq.numel()}")
            model = torch.nn.Sequential(lin)
            Quantizer(groupsize=group).convert(model)
            conv = model[0]
            assert conv.weight.dtype == torch.int8, conv.weight.dtype
            p = f"{name}.w{k}."
            t.update({p + "w": w, p + "fq": fq.detach(), p + "g": g, p + "ste": wr.grad,
                      p + "group": torch.tensor([group], dtype=torch.int32), p + "q": conv.weight.detach(),
                      p + "scales": conv.scales.detach().float(), p + "zeros": conv.zeros.detach().float()})
    # The whole linear on a bf16 model (precision=bfloat16): y = F.linear(fq(x), fq(w)) in bf16 and its
    # backward, from the bf16 case 0 activations and weights.
    x, w = t["bf16.a0.x"], t["bf16.w0.w"]
    lin = Int8DynActInt4WeightQATLinear(64, 16, bias=False, groupsize=32, precision=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    xl = x.clone().requires_grad_(True)
    y = lin(xl)
    dy = torch.randn(y.shape, generator=gen).to(torch.bfloat16)
    y.backward(dy)
    assert y.dtype == xl.grad.dtype == lin.weight.grad.dtype == torch.bfloat16
    t.update({"bf16.linear.y": y.detach(), "bf16.linear.dy": dy, "bf16.linear.dx": xl.grad,
              "bf16.linear.dw": lin.weight.grad})
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, "kernels_lowp.safetensors"))
    print("kernels_lowp: elements where the fp32 arithmetic rounded once differs:", ", ".join(counts))


def make_tokens(gen, vocab, n_samples, seq_len):
    """Learnable streams (a successor table over a pool of 24 ids, 20% noise): the loss moves."""
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


def train(config, state, tokens, t, perturb):
    """torchao's prepare on model.model.layers, then the HF Trainer's step written out."""
    model = LlamaForCausalLM(config).float()
    model.load_state_dict(state)
    if perturb:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if ".layers." in n and "norm" not in n:
                    p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
    mb, seq, steps = t["micro_batch_size"], t["seq_len"], t["max_steps"]
    quantizer = Int8DynActInt4WeightQATQuantizer(groupsize=GROUP)
    quantizer.prepare(model.model.layers)
    n_qat = sum(isinstance(m, Int8DynActInt4WeightQATLinear) for m in model.modules())
    assert n_qat == 7 * config.num_hidden_layers, n_qat
    model.train()
    params = list(model.parameters())
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=t["lr"],
                                  betas=(t["adam_beta1"], t["adam_beta2"]), eps=t["adam_epsilon"])
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, t["warmup_steps"], steps)
    losses, norms = [], []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        batch = tokens[step * mb:(step + 1) * mb]
        logits = model(input_ids=batch[:, :seq]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, t["max_grad_norm"])))
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return model, quantizer, losses, norms


def make_trajectory(out_root):
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, initializer_range=0.02, attention_dropout=0.0, hidden_act="silu",
        attn_implementation="eager", torch_dtype="float32")
    model = LlamaForCausalLM(config).float()
    t = dict(TRAINING)
    mb, seq, steps = t["micro_batch_size"], t["seq_len"], t["max_steps"]
    out = os.path.join(out_root, "trajectory")
    model.save_pretrained(out, safe_serialization=True)
    gen = torch.Generator().manual_seed(SEED + 1)
    tokens = make_tokens(gen, config.vocab_size, steps * mb, seq)
    flat = tokens.reshape(-1).tolist()
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dI" % len(flat), *flat))

    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    model, quantizer, losses, norms = train(config, base_state, tokens, t, perturb=False)
    assert losses[-1] < losses[0] - 0.05, f"the loss barely moves ({losses})"
    # The reference's own sensitivity: the same run from weights one ulp away (every decoder
    # linear weight nudged up by one ulp). Quantization boundaries make the trajectory chaotic at
    # this level; the test's tolerance after the first step is taken from this spread.
    _, _, ulp_losses, _ = train(config, base_state, tokens, t, perturb=True)
    spread = [abs(a - b) / abs(a) for a, b in zip(losses, ulp_losses)]

    trained = os.path.join(out_root, "trained")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    os.makedirs(trained)
    save_file(state, os.path.join(trained, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(out, "config.json"), os.path.join(trained, "config.json"))

    quantizer.convert(model.model.layers)
    converted = {}
    for name, m in model.model.layers.named_modules():
        if hasattr(m, "scales") and hasattr(m, "zeros"):
            p = "model.layers." + name
            converted[p + ".weight"] = m.weight.detach().contiguous()
            converted[p + ".scales"] = m.scales.detach().contiguous()
            converted[p + ".zeros"] = m.zeros.detach().contiguous()
    assert len(converted) == 3 * 7 * config.num_hidden_layers, sorted(converted)
    dtypes = sorted({str(v.dtype) for v in converted.values()})
    save_file(converted, os.path.join(out_root, "converted.safetensors"))

    expected = {
        "qat": {"scheme": "8da4w", "group_size": GROUP, "prepared": "model.model.layers"},
        "training": t,
        "losses": losses,
        "grad_norms": norms,
        "ulp_spread": spread,
        "converted_dtypes": dtypes,
        "versions": {"torch": torch.__version__, "torchao": torchao.__version__,
                     "transformers": transformers.__version__},
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
    print(f"trajectory: losses {['%.5f' % x for x in losses]} grad norms {['%.3f' % x for x in norms]}; "
          f"one-ulp spread {['%.2g' % x for x in spread]}; converted dtypes {dtypes}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=["kernels_lowp"],
                    help="write only this part into --out (keeping the rest of the directory)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.only == "kernels_lowp":
        os.makedirs(a.out, exist_ok=True)
        make_kernels_lowp(a.out)
        return
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)
    make_kernels(a.out)
    make_kernels_lowp(a.out)
    make_trajectory(a.out)


if __name__ == "__main__":
    main()
