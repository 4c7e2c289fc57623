#include "kernels/activation.h"

#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kForward);
  require_cpu(gu, "swiglu_forward");
  const std::int64_t I = h.dim(-1), T = h.numel() / I;
  require_numel(gu, T * 2 * I, "swiglu_forward", "gate/up");
  const float* g = gu.f32();
  float* out = h.f32();
  parallel_for(T, 4, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<float> sig(static_cast<std::size_t>(I));
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* gate = g + t * 2 * I;
      const float* up = gate + I;
      float* o = out + t * I;
      vec::sigmoid(gate, sig.data(), I);
      for (std::int64_t i = 0; i < I; ++i) o[i] = gate[i] * sig[static_cast<std::size_t>(i)] * up[i];
    }
  });
}

void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  require_cpu(gu, "swiglu_backward");
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  require_numel(gu, T * 2 * I, "swiglu_backward", "gate/up");
  require_numel(dgu, T * 2 * I, "swiglu_backward", "gate/up gradient");
  const float* g = gu.f32();
  const float* d = dh.f32();
  float* out = dgu.f32();
  parallel_for(T, 4, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<float> sig(static_cast<std::size_t>(I));
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* gate = g + t * 2 * I;
      const float* up = gate + I;
      const float* dr = d + t * I;
      float* dgate = out + t * 2 * I;
      float* dup = dgate + I;
      vec::sigmoid(gate, sig.data(), I);
      for (std::int64_t i = 0; i < I; ++i) {
        const float s = sig[static_cast<std::size_t>(i)], x = gate[i];
        const float silu = x * s;
        dup[i] = dr[i] * silu;
        dgate[i] = dr[i] * up[i] * s * (1.0f + x * (1.0f - s));
      }
    }
  });
}

}  // namespace scalelab::kernels
