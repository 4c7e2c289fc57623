#pragma once
// The scalar steps of the qat family (qat.h), shared by the CPU backend and the CUDA kernels so
// both compute exactly torchao's fp32 operations in torchao's order.
#include <cstdint>

#if defined(__CUDACC__)
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

// Per-token int8 asymmetric parameters of a row with minimum lo_raw and maximum hi_raw.
struct Affine {
  float scale, inv, zp;
  float qmin, qmax;
};

SCALELAB_QAT_FN Affine per_token_params(float lo_raw, float hi_raw) {
  const float lo = fmin0(lo_raw, 0.0f), hi = fmax0(hi_raw, 0.0f);
  float s = (hi - lo) / 255.0f;
  const float eps = 1.1920928955078125e-07f;  // torch.finfo(torch.float32).eps
  if (s < eps) s = eps;
  float zp = -128.0f - round_even(lo / s);
  zp = fmin0(fmax0(zp, -128.0f), 127.0f);
  return {s, 1.0f / s, zp, -128.0f, 127.0f};
}

// Int4 grouped symmetric parameters of a group with minimum lo_raw and maximum hi_raw.
SCALELAB_QAT_FN Affine group_params(float lo_raw, float hi_raw) {
  const float lo = fmin0(lo_raw, 0.0f), hi = fmax0(hi_raw, 0.0f);
  const float amax = fmax0(-lo, hi);
  float s = amax / 7.5f;
  const float smallest_normal = 1.17549435082228750797e-38f;  // torch.finfo(torch.float32).smallest_normal
  if (s < smallest_normal) s = smallest_normal;
  return {s, 1.0f / s, 0.0f, -8.0f, 7.0f};
}

// The quantized integer before clamping; strictly inside (qmin, qmax): the STE mask (torch.clamp's
// backward passes no gradient at the bounds themselves, checked against torch 2.15).
SCALELAB_QAT_FN float unclamped(float x, const Affine& a) { return round_even(x * a.inv) + a.zp; }
SCALELAB_QAT_FN float clamp_q(float q, const Affine& a) { return fmin0(fmax0(q, a.qmin), a.qmax); }
SCALELAB_QAT_FN float fake_quant(float x, const Affine& a) { return (clamp_q(unclamped(x, a), a) - a.zp) * a.scale; }
// The gradient torchao's graph passes back to x for incoming gradient g.
SCALELAB_QAT_FN float ste(float g, float x, const Affine& a) {
  const float q = unclamped(x, a);
  return q > a.qmin && q < a.qmax ? (g * a.scale) * a.inv : 0.0f;
}

}  // namespace scalelab::kernels::qat
