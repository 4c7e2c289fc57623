#pragma once
// Fake quantization for quantization-aware training (qat family), as torchao's
// Int8DynActInt4WeightQATQuantizer (torchao 0.18, quantization/qat/linear.py + quant_primitives.py):
//
// Activations, int8 dynamic per-token asymmetric (qmin −128, qmax 127), one row x of [T, in]:
//   lo = min(min(x), 0), hi = max(max(x), 0)
//   s  = max((hi − lo) / 255, 2^-23)                     (fp32 eps, torchao's activation config)
//   zp = clamp(−128 − round(lo / s), −128, 127)
//   q  = clamp(round(x · (1/s)) + zp, −128, 127);  fq(x) = (q − zp) · s
// Weights, int4 grouped symmetric (qmin −8, qmax 7), each group g of `group` columns of a row of w:
//   s  = max(max(−min(min(g), 0), max(max(g), 0)) / 7.5, FLT_MIN)   (fp32 smallest normal)
//   q  = clamp(round(g · (1/s)) + 0, −8, 7);  fq(g) = (q − 0) · s
// round is half-to-even (torch.round); every operation is one fp32 operation in this order, so the
// results are torchao's bit for bit; 1/s is the fp32 reciprocal, as torchao's `x * (1.0 / scale)`.
//
// Backward is torchao's straight-through estimator, as its autograd graph computes it: the scale
// and zero point carry no gradient (choose_qparams is no_grad), round passes the gradient through
// (_Round), clamp passes it where the unclamped value q was strictly inside (qmin, qmax) — torch's
// clamp backward gives no gradient at the bounds themselves, so a value that quantizes to −8 or 7
// (−128 or 127: e.g. each group's largest magnitude) gets none — and the two
// multiplications by s and 1/s stay: d = mask ? (g · s) · (1/s) : 0 (not always exactly g).
//   fake_quant_per_token_forward:  y = fq(x) per row               (assigned)
//   fake_quant_per_token_backward: dx = d(dy; x) or dx += d(dy; x) (activation gradient: assigned,
//                                  or added when accumulate, for a Linear that adds into dx)
//   fake_quant_group_forward:      wq = fq(w) per group            (assigned)
//   fake_quant_group_backward:     dw += d(g; w)                   (parameter gradient: accumulated)
// The masks and scales are recomputed from x and w in backward (nothing is kept). Compute is fp32;
// tensors may be fp32, bf16 or fp16 (bit-exactness with torchao is for fp32).
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

// x, y, dx, dy: [rows, cols] (any leading shape; rows = numel / last dim).
void fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext& ctx);
void fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate, ExecContext& ctx);
// w, wq, g, dw: [out, in] with in % group == 0.
void fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext& ctx);
void fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group, ExecContext& ctx);

// The int4 quantization of torchao's convert (the integers and scales fake_quant_group_forward
// multiplies back): q[r, c] in [−8, 7] as int8, scales[r, c / group] fp32 (zero points are 0).
// Host-side (scalelab quantize), fp32 w only.
void quantize_int4_grouped(std::int8_t* q, float* scales, const float* w, std::int64_t rows, std::int64_t cols,
                           std::int64_t group);

}  // namespace scalelab::kernels
