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
// round is half-to-even (torch.round); on fp32 tensors every operation is one fp32 operation in this
// order, so the results are torchao's bit for bit; 1/s is the fp32 reciprocal, as torchao's `x * (1.0 / scale)`.
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
// The masks and scales are recomputed from x and w in backward (nothing is kept).
//
// bf16 and fp16 tensors: torchao's arithmetic on a tensor of that dtype t, bit for bit (the
// fake quantizer's arithmetic follows its input's dtype; r(v) = v rounded to t, qat_math.h's
// `stored`, since PyTorch computes each bf16/fp16 op in fp32 and rounds its result):
//   min, max, the clamps against 0 and |·|: in t (exact)
//   activations  s = max(r(r(hi − lo) / 255), 2^-23);  zp = clamp(r(−128 − round(r(lo / s))), −128, 127)
//   weights      s = max(r(amax / 7.5), smallest normal of t)  (2^-126 for bf16 as fp32, 2^-14 for fp16)
//   then s and zp are cast to fp32 (exact): q = clamp(round(x · (1/s)) + zp) in fp32 (x widened:
//   torch promotes t × fp32 to fp32), fq(x) = r((q − zp) · s) — q − zp is exact in t, the
//   product exact in fp32, so the one rounding is the store's;
//   STE  d = mask ? r(r(g · s) · (1/s)) : 0 (the backward of `(q − zp) · s` and of `x · (1/s)`,
//   each a t tensor times an fp32 one, cast back to t); an accumulated gradient adds in fp32
//   and rounds once, as autograd's add of two t tensors.
// For fp32 every r is the identity: the fp32 arithmetic above. Tensors may mix dtypes (a bf16
// x with an fp32 dx): the arithmetic is the quantized tensor's (x or w), the store rounds to the
// output's. tests/golden/make_qat_golden.py holds torchao's results on bf16 and fp16 tensors.
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
// Host-side (scalelab quantize). w holds the values of a tensor of dtype t, widened to fp32; the
// scales follow t's arithmetic as fake_quant_group_forward does (torchao's convert computes them
// with the same get_group_qparams_symmetric on the weight's dtype), so q · scale rounded to t is
// the fake-quantized weight the forward of a t model used.
void quantize_int4_grouped(std::int8_t* q, float* scales, const float* w, std::int64_t rows, std::int64_t cols,
                           std::int64_t group, DType t = DType::kF32);

}  // namespace scalelab::kernels
