#!/usr/bin/env python3
"""What torchao's 8da4w fake quantizers compute under bf16, against scalelab's arithmetic.

Reference tooling only (no golden written; the goldens are make_qat_golden.py's
kernels_lowp.safetensors). Run it in the virtualenv of requirements-qat.txt:
    $SCALELAB_QAT_VENV/bin/python tests/golden/check_qat_bf16_torchao.py

1. A bf16 model (--model-precision bf16): torchao 0.18 on a bf16 tensor computes the scale and zero
   point in bf16 (each op of choose_qparams_affine rounded to bf16, then cast to fp32) and rounds
   the straight-through gradient's two products to bf16. scalelab's kernels do the same since
   2026-11-26 (kernels/qat.h); before, they computed in fp32 and rounded once. The script
   emulates both with numpy and counts the elements that differ from torchao on random tensors.
   Measured (torch 2.15.0, torchao 0.18.0; 20 random [64, 256] pairs, groups 8 to 256): the
   dtype's arithmetic differs in 0 elements, bf16 and fp16, forward and STE; the old fp32 arithmetic
   rounded once in 39 % of the bf16 activations, 11 % of the weights, 10 % of the STE gradients.
2. Mixed precision (--mixed-precision bf16: torch.autocast on an fp32 model): the fake quantizers
   run before F.linear, outside autocast's casts, on the dtypes their inputs have. The script hooks
   every fake quantizer of a tiny Llama prepared as the QAT golden prepares it and prints the
   dtypes it saw. Measured: every weight fp32 (the fp32 masters; autocast casts the fake-quantized
   weight to bf16 afterwards); the activations of q/k/v_proj and gate/up_proj fp32 (the RMSNorm
   output in the fp32 residual stream), those of o_proj and down_proj bf16 (the output of bf16
   matmuls). docs/finetuning.md says where scalelab differs.
3. Mixed precision, weights: torchao's bf16(fq(fp32 master)) against the fake quantization of the
   bf16 compute copy that scalelab's QatLinear receives. Measured: 27.4 % of the elements differ in
   the copy's bf16 arithmetic (now), 23.1 % in fp32 arithmetic rounded once (before): the input, not
   the arithmetic, is what differs — only fake-quantizing the fp32 master would match.
"""
import warnings

import numpy as np
import torch
from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer
from torchao.quantization.qat.linear import Int8DynActInt4WeightQATLinear
from transformers import LlamaConfig, LlamaForCausalLM

warnings.filterwarnings("ignore")
F32 = np.float32


def r(v, dt):
    """v rounded to dt (to nearest even) and widened back: one PyTorch op on dt tensors."""
    if dt == torch.float32:
        return np.asarray(v, dtype=F32)
    return torch.from_numpy(np.asarray(v, dtype=F32)).to(dt).float().numpy()


def per_token(x, dt):
    lo = np.minimum(x.min(1), F32(0))
    hi = np.maximum(x.max(1), F32(0))
    s = np.maximum(r(r(hi - lo, dt) / F32(255), dt), F32(2.0 ** -23))
    zp = np.clip(r(F32(-128) - np.round(r(lo / s, dt)), dt), -128, 127).astype(F32)
    return s[:, None], zp[:, None]


def per_group(w, group, dt):
    g = w.reshape(w.shape[0], -1, group)
    amax = np.maximum(-np.minimum(g.min(2), F32(0)), np.maximum(g.max(2), F32(0)))
    s = np.maximum(r(amax / F32(7.5), dt), F32(torch.finfo(dt).smallest_normal))
    return np.repeat(s, group, axis=1), np.zeros((w.shape[0], w.shape[1]), F32)


def fake_quant(x, s, zp, qmin, qmax, dt, grad):
    inv = (F32(1) / s).astype(F32)
    u = np.round((x * inv).astype(F32)) + zp
    fq = r((np.clip(u, qmin, qmax) - zp) * s, dt)
    ste = np.where((u > qmin) & (u < qmax), r(r(grad * s, dt) * inv, dt), F32(0))
    return fq, ste


def scalelab(x, g, dt, group, arithmetic):
    """scalelab's fake quantization of x (dt values) in `arithmetic` (dt: now; fp32: before)."""
    s, zp = per_token(x, arithmetic) if group is None else per_group(x, group, arithmetic)
    qmin, qmax = (-128, 127) if group is None else (-8, 7)
    fq, ste = fake_quant(x, s, zp, qmin, qmax, arithmetic, g)
    return r(fq, dt), r(ste, dt)


def differing(a, b):
    return int((a.view(np.uint32) != b.float().numpy().view(np.uint32)).sum())


def part1():
    torch.manual_seed(0)
    np.random.seed(0)
    print("1. torchao on bf16/fp16 tensors against scalelab's arithmetic (elements that differ):")
    for dt in (torch.bfloat16, torch.float16):
        totals = {"dtype's arithmetic": [0, 0, 0, 0], "fp32 rounded once": [0, 0, 0, 0]}
        n_act = n_w = 0
        for trial in range(20):
            rows, cols, out, group = 64, 256, 64, [8, 16, 32, 64, 256][trial % 5]
            lin = Int8DynActInt4WeightQATLinear(cols, out, bias=False, groupsize=group)
            scale = float(10 ** np.random.uniform(-3, 2))
            x = (torch.randn(rows, cols) * scale + (trial % 3 - 1) * scale).to(dt)
            w = (torch.randn(out, cols) * 0.05 * float(10 ** np.random.uniform(-2, 2))).to(dt)
            w[0, :group] = 0
            xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            ax, aw = lin.activation_fake_quantizer(xr), lin.weight_fake_quantizer(wr)
            gx, gw = torch.randn(ax.shape).to(dt), torch.randn(aw.shape).to(dt)
            ax.backward(gx)
            aw.backward(gw)
            n_act += x.numel()
            n_w += w.numel()
            for name, arith in (("dtype's arithmetic", dt), ("fp32 rounded once", torch.float32)):
                fx, sx = scalelab(x.float().numpy(), gx.float().numpy(), dt, None, arith)
                fw, sw = scalelab(w.float().numpy(), gw.float().numpy(), dt, group, arith)
                t = totals[name]
                t[0] += differing(fx, ax.detach())
                t[1] += differing(sx, xr.grad)
                t[2] += differing(fw, aw.detach())
                t[3] += differing(sw, wr.grad)
        for name, t in totals.items():
            print(f"   {str(dt):15s} {name:19s}: fq(x) {t[0] / n_act:6.1%}  ste(x) {t[1] / n_act:6.1%}  "
                  f"fq(w) {t[2] / n_w:6.1%}  ste(w) {t[3] / n_w:6.1%}")


def part2():
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                         attn_implementation="eager")
    seen = {}
    for mode in ("autocast", "bf16 model"):
        model = LlamaForCausalLM(config).float()
        if mode == "bf16 model":
            model = model.to(torch.bfloat16)
        Int8DynActInt4WeightQATQuantizer(groupsize=32).prepare(model.model.layers)
        for name, m in model.named_modules():
            if isinstance(m, Int8DynActInt4WeightQATLinear):
                short = name.split(".")[-1]
                for kind, fq in (("activation", m.activation_fake_quantizer), ("weight", m.weight_fake_quantizer)):
                    def record(mod, args, key=(mode, short, kind)):
                        seen.setdefault(key, str(args[0].dtype))
                    fq.register_forward_pre_hook(record)
        ids = torch.randint(0, 256, (2, 16))
        if mode == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    print("2. the dtypes torchao's fake quantizers see (tiny Llama, one layer):")
    for mode in ("autocast", "bf16 model"):
        print(f"   {mode}:")
        for short in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            print(f"     {short:10s} activation {seen[(mode, short, 'activation')]:15s} "
                  f"weight {seen[(mode, short, 'weight')]}")


def part3():
    """Mixed precision, weights: torchao fake-quantizes the fp32 master in fp32 and autocast casts the
    result to bf16; scalelab's QatLinear gets the bf16 compute copy of the master."""
    torch.manual_seed(2)
    np.random.seed(2)
    n = diff_new = diff_old = 0
    for trial in range(20):
        out, cols, group = 64, 256, [8, 16, 32, 64, 256][trial % 5]
        w = torch.randn(out, cols) * 0.05 * float(10 ** np.random.uniform(-2, 2))
        lin = Int8DynActInt4WeightQATLinear(cols, out, bias=False, groupsize=group)
        with torch.no_grad():
            want = lin.weight_fake_quantizer(w).to(torch.bfloat16)  # torchao under autocast
        wb = w.to(torch.bfloat16).float().numpy()  # the compute copy's values
        g0 = np.zeros_like(wb)
        new, _ = scalelab(wb, g0, torch.bfloat16, group, torch.bfloat16)
        old, _ = scalelab(wb, g0, torch.bfloat16, group, torch.float32)
        n += w.numel()
        diff_new += differing(new, want)
        diff_old += differing(old, want)
    print("3. mixed precision, fake-quantized weights against torchao's bf16(fq(fp32 master)):")
    print(f"   fq of the bf16 copy in bf16 arithmetic (scalelab now) {diff_new / n:6.1%} of elements differ; "
          f"in fp32 arithmetic rounded once (before) {diff_old / n:6.1%}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    part1()
    part2()
    part3()
