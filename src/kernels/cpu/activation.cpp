#include "kernels/activation.h"

#include "core/parallel.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kForward);
  require_cpu(gu, "swiglu_forward");
  const std::int64_t I = h.dim(-1), T = h.numel() / I;
  require_numel(gu, T * 2 * I, "swiglu_forward", "gate/up");
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

void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  require_cpu(gu, "swiglu_backward");
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  require_numel(gu, T * 2 * I, "swiglu_backward", "gate/up");
  require_numel(dgu, T * 2 * I, "swiglu_backward", "gate/up gradient");
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

}  // namespace scalelab::kernels
