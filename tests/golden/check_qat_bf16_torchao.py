#!/usr/bin/env python3
"""How far torchao's fake quantization of a bf16 model is from scalelab's bf16 arithmetic.

scalelab's qat kernels widen bf16 operands, compute in fp32 and round each stored element once
(QatKernels.Bf16StorageIsTheFp32ArithmeticRoundedOnce). torchao 0.18 (Int8DynActInt4WeightQATLinear)
on a bf16 tensor computes the scale and zero point in bf16 (choose_qparams_affine divides in the
input's dtype before casting the scale to fp32). This script counts the elements where the two
differ: torchao on a bf16 tensor against torchao on the same values in fp32, rounded to bf16 (which
is what scalelab computes). Reference tooling only (no golden written); run it in the virtualenv of
requirements-qat.txt:  $SCALELAB_QAT_VENV/bin/python tests/golden/check_qat_bf16_torchao.py
Measured (torch 2.15.0, torchao 0.18.0): activations 41 % of elements (every row), weights 10 %
of elements (59 % of groups), the largest weight difference one whole int4 step of its group (1.02
steps: the scales differ slightly too).
"""
import warnings

import torch
from torchao.quantization.qat.linear import Int8DynActInt4WeightQATLinear

warnings.filterwarnings("ignore")
torch.manual_seed(0)
rows, cols, out, group = 64, 256, 64, 32
lin = Int8DynActInt4WeightQATLinear(cols, out, bias=False, groupsize=group)
x = torch.randn(rows, cols).bfloat16()
w = (torch.randn(out, cols) * 0.05).bfloat16()
with torch.no_grad():
    a16 = lin.activation_fake_quantizer(x)  # torchao on a bf16 tensor
    a32 = lin.activation_fake_quantizer(x.float()).bfloat16()  # fp32 arithmetic, stored bf16
    w16 = lin.weight_fake_quantizer(w)
    w32 = lin.weight_fake_quantizer(w.float()).bfloat16()
da, dw = a16 != a32, w16 != w32
print(f"activations: {da.float().mean():.1%} of elements differ, {da.any(1).float().mean():.0%} of rows")
print(f"weights: {dw.float().mean():.1%} of elements differ, {dw.view(out, -1, group).any(2).float().mean():.0%} of groups; "
      f"largest difference {(w16.float() - w32.float()).abs().max() / w32.float().abs().max():.3g} of the largest weight")
step = w.float().view(out, -1, group).abs().amax(2, keepdim=True) / 7.5  # a group's int4 step
diff = (w16.float() - w32.float()).view(out, -1, group).abs() / step
print(f"weights: the largest difference {diff.max():.2f} int4 steps of its group")
