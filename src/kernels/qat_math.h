#pragma once
// The scalar steps of the qat family (qat.h), shared by the CPU backend and the CUDA kernels so
// both compute exactly torchao's operations in torchao's order.
//
// The dtype of the quantized tensor (x or w) sets the arithmetic of its scale and zero point and of
// the straight-through gradient, as torchao's on a tensor of that dtype (torchao 0.18,
// quant_primitives.py; the op sequence is in qat.h): `stored(v, t)` is v rounded to t (to nearest
// even) and widened back — the value a PyTorch op on t tensors gives, since PyTorch's CPU kernels
// for bf16/fp16 compute each op in fp32 and round its result. For fp32 it is the identity, so the
// fp32 steps are exactly the plain fp32 operations.
#include <cstdint>

#include "core/dtype.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define SCALELAB_QAT_FN __host__ __device__ __forceinline__
#else
#define SCALELAB_QAT_FN inline
#endif

namespace scalelab::kernels::qat {

// torch.round: half to even. rintf under the default rounding mode (round to nearest even).
SCALELAB_QAT_FN float round_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return __builtin_rintf(v);
#endif
}
SCALELAB_QAT_FN float fmin0(float a, float b) { return a < b ? a : b; }
SCALELAB_QAT_FN float fmax0(float a, float b) { return a > b ? a : b; }

// v rounded to nearest even in dtype t and widened back to fp32 (identity for fp32): core/dtype.h's
// conversions on the host, CUDA's __float2bfloat16_rn / __float2half_rn on the device (the same
// rounding: NaN stays NaN, overflow goes to infinity, fp16 subnormals are exact).
// Each step below comes as a template on the dtype (the CPU kernels instantiate it once per call,
// so the fp32 path compiles to exactly the plain fp32 operations, with no per-run dtype test) and
// as a function of the dtype at run time (CUDA, tests, quantize), which dispatches to it.
template <DType kT>
SCALELAB_QAT_FN float stored_t(float v) {
#if defined(__CUDA_ARCH__)
  if constexpr (kT == DType::kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if constexpr (kT == DType::kF16) return __half2float(__float2half_rn(v));
#else
  if constexpr (kT == DType::kBF16) return bf16_to_float(float_to_bf16(v));
  if constexpr (kT == DType::kF16) return fp16_to_float(float_to_fp16(v));
#endif
  return v;
}
SCALELAB_QAT_FN float stored(float v, DType t) {
  return t == DType::kBF16 ? stored_t<DType::kBF16>(v) : t == DType::kF16 ? stored_t<DType::kF16>(v) : v;
}

// The parameters of one run (an activation row or a weight group) of a tensor of dtype t.
struct Affine {
  float scale, inv, zp;
  float qmin, qmax;
  DType t;  // the quantized tensor's dtype: the rounding of the STE's two products
};

// Per-token int8 asymmetric parameters of a row with minimum lo_raw and maximum hi_raw (values of
// a tensor of dtype kT): choose_qparams_affine's ops, each rounded to kT; eps is fp32's whatever
// the dtype (the 8da4w activation config), exact in bf16 and fp16.
template <DType kT>
SCALELAB_QAT_FN Affine per_token_params_t(float lo_raw, float hi_raw) {
  const float lo = fmin0(lo_raw, 0.0f), hi = fmax0(hi_raw, 0.0f);
  float s = stored_t<kT>(stored_t<kT>(hi - lo) / 255.0f);
  const float eps = 1.1920928955078125e-07f;  // torch.finfo(torch.float32).eps
  if (s < eps) s = eps;
  float zp = stored_t<kT>(-128.0f - round_even(stored_t<kT>(lo / s)));
  zp = fmin0(fmax0(zp, -128.0f), 127.0f);
  return {s, 1.0f / s, zp, -128.0f, 127.0f, kT};  // the scale is cast to fp32 (exact), 1/s in fp32
}

// Int4 grouped symmetric parameters of a group with minimum lo_raw and maximum hi_raw (values of a
// tensor of dtype kT): the division by 7.5 rounded to kT, the floor kT's smallest normal (torchao's
// default eps for the weights: finfo(w.dtype).smallest_normal — fp32's and bf16's are the same).
template <DType kT>
SCALELAB_QAT_FN Affine group_params_t(float lo_raw, float hi_raw) {
  const float lo = fmin0(lo_raw, 0.0f), hi = fmax0(hi_raw, 0.0f);
  const float amax = fmax0(-lo, hi);
  float s = stored_t<kT>(amax / 7.5f);
  const float smallest_normal = kT == DType::kF16 ? 6.103515625e-05f             // finfo(float16).smallest_normal
                                                  : 1.17549435082228750797e-38f;  // finfo(float32 / bfloat16)
  if (s < smallest_normal) s = smallest_normal;
  return {s, 1.0f / s, 0.0f, -8.0f, 7.0f, kT};
}

SCALELAB_QAT_FN Affine per_token_params(float lo_raw, float hi_raw, DType t = DType::kF32) {
  return t == DType::kBF16  ? per_token_params_t<DType::kBF16>(lo_raw, hi_raw)
         : t == DType::kF16 ? per_token_params_t<DType::kF16>(lo_raw, hi_raw)
                            : per_token_params_t<DType::kF32>(lo_raw, hi_raw);
}
SCALELAB_QAT_FN Affine group_params(float lo_raw, float hi_raw, DType t = DType::kF32) {
  return t == DType::kBF16  ? group_params_t<DType::kBF16>(lo_raw, hi_raw)
         : t == DType::kF16 ? group_params_t<DType::kF16>(lo_raw, hi_raw)
                            : group_params_t<DType::kF32>(lo_raw, hi_raw);
}

// The quantized integer before clamping; strictly inside (qmin, qmax): the STE mask (torch.clamp's
// backward passes no gradient at the bounds themselves, checked against torch 2.15). x · (1/s) is
// an fp32 product whatever the dtype (torch promotes a bf16 tensor times the fp32 reciprocal to fp32).
SCALELAB_QAT_FN float unclamped(float x, const Affine& a) { return round_even(x * a.inv) + a.zp; }
SCALELAB_QAT_FN float clamp_q(float q, const Affine& a) { return fmin0(fmax0(q, a.qmin), a.qmax); }
// In fp32; the store to a tensor of dtype a.t rounds it once, as torchao's final cast does (q − zp
// and s are both exact in that dtype, so their fp32 product is exact and that one rounding is the
// only one).
SCALELAB_QAT_FN float fake_quant(float x, const Affine& a) { return (clamp_q(unclamped(x, a), a) - a.zp) * a.scale; }
// The gradient torchao's graph passes back to x for incoming gradient g: the backward of
// `dequant * scale` (a tensor of dtype a.t times fp32) is g·s rounded to a.t, the backward of
// `x * (1/s)` that times 1/s rounded to a.t again. kT must be a.t.
template <DType kT>
SCALELAB_QAT_FN float ste_t(float g, float x, const Affine& a) {
  const float q = unclamped(x, a);
  return q > a.qmin && q < a.qmax ? stored_t<kT>(stored_t<kT>(g * a.scale) * a.inv) : 0.0f;
}
SCALELAB_QAT_FN float ste(float g, float x, const Affine& a) {
  return a.t == DType::kBF16  ? ste_t<DType::kBF16>(g, x, a)
         : a.t == DType::kF16 ? ste_t<DType::kF16>(g, x, a)
                              : ste_t<DType::kF32>(g, x, a);
}

}  // namespace scalelab::kernels::qat
