// Activations on the CPU (activation.h).
#include "kernels/activation.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"

namespace scalelab::kernels::cpu {

void CpuBackend::swiglu_forward(Tensor& h, const Tensor& gu, ExecContext&) {
  const std::int64_t I = h.dim(-1), T = h.numel() / I;
  parallel_for(T, row_grain(2 * I), [&](std::int64_t t0, std::int64_t t1) {
    float* sig = row_buffer(I, 3);
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* gate = load_row(elem(gu.raw(), gu.dtype(), t * 2 * I), gu.dtype(), 2 * I, 0);
      const float* up = gate + I;
      void* dst = elem(h.raw(), h.dtype(), t * I);
      float* o = out_row(dst, h.dtype(), I, 1);
      vec::sigmoid(gate, sig, I);
      for (std::int64_t i = 0; i < I; ++i) o[i] = gate[i] * sig[i] * up[i];
      store_row(o, dst, h.dtype(), I);
    }
  });
}

void CpuBackend::swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext&) {
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  parallel_for(T, row_grain(2 * I), [&](std::int64_t t0, std::int64_t t1) {
    float* sig = row_buffer(I, 3);
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* gate = load_row(elem(gu.raw(), gu.dtype(), t * 2 * I), gu.dtype(), 2 * I, 0);
      const float* up = gate + I;
      const float* dr = load_row(elem(dh.raw(), dh.dtype(), t * I), dh.dtype(), I, 1);
      void* dst = elem(dgu.raw(), dgu.dtype(), t * 2 * I);
      float* dgate = out_row(dst, dgu.dtype(), 2 * I, 2);
      float* dup = dgate + I;
      vec::sigmoid(gate, sig, I);
      for (std::int64_t i = 0; i < I; ++i) {
        const float s = sig[i], x = gate[i];
        const float silu = x * s;
        dup[i] = dr[i] * silu;
        dgate[i] = dr[i] * up[i] * s * (1.0f + x * (1.0f - s));
      }
      store_row(dgate, dst, dgu.dtype(), 2 * I);
    }
  });
}

namespace {

// Elementwise over chunks of a flat tensor, staging low-precision storage through row buffers.
template <class F>
void pointwise(Tensor& out, const Tensor& a, const Tensor* b, F&& f) {
  const std::int64_t n = a.numel();
  constexpr std::int64_t kChunk = 2048;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, row_grain(kChunk), [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
      const float* ap = load_row(elem(a.raw(), a.dtype(), begin), a.dtype(), len, 0);
      const float* bp = b ? load_row(elem(b->raw(), b->dtype(), begin), b->dtype(), len, 1) : nullptr;
      void* dst = elem(out.raw(), out.dtype(), begin);
      float* o = out_row(dst, out.dtype(), len, 2);
      for (std::int64_t i = 0; i < len; ++i) o[i] = f(ap[i], bp ? bp[i] : 0.0f);
      store_row(o, dst, out.dtype(), len);
    }
  });
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

}  // namespace

void CpuBackend::activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext&) {
  if (act == Activation::kReLU) {
    pointwise(y, x, nullptr, [](float v, float) { return v > 0.0f ? v : 0.0f; });
  } else {
    pointwise(y, x, nullptr, [](float v, float) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); });
  }
}

void CpuBackend::activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act, ExecContext&) {
  if (act == Activation::kReLU) {
    pointwise(dx, dy, &x, [](float g, float v) { return v > 0.0f ? g : 0.0f; });
  } else {
    pointwise(dx, dy, &x, [](float g, float v) {
      const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
      return g * (cdf + v * pdf);
    });
  }
}

}  // namespace scalelab::kernels::cpu
