#include "kernels/norm.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  require_cpu(x, "rmsnorm_forward");
  const std::int64_t H = w.numel(), rows = x.numel() / H;
  require_numel(y, rows * H, "rmsnorm_forward", "output");
  require_numel(rstd, rows, "rmsnorm_forward", "rstd");
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* yp = y.f32();
  float* rp = rstd.f32();
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * H;
      float ss = 0.0f;
      for (std::int64_t i = 0; i < H; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
      rp[r] = inv;
      float* yr = yp + r * H;
      for (std::int64_t i = 0; i < H; ++i) yr[i] = wp[i] * (xr[i] * inv);
    }
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w,
                      ExecContext& ctx, bool accumulate_dx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  require_cpu(x, "rmsnorm_backward");
  const std::int64_t H = w.numel(), rows = x.numel() / H;
  require_numel(dx, rows * H, "rmsnorm_backward", "input gradient");
  require_numel(dy, rows * H, "rmsnorm_backward", "output gradient");
  require_numel(dw, H, "rmsnorm_backward", "weight gradient");
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* gp = dy.f32();
  const float* rp = rstd.f32();
  float* dxp = dx.f32();
  // Weight gradients: one partial row per thread, summed in thread order (deterministic).
  const int nt = num_threads();
  std::vector<float> partial(static_cast<std::size_t>(nt) * H, 0.0f);
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    float* dwp = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * H;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * H;
      const float* gr = gp + r * H;
      const float inv = rp[r];
      float dot = 0.0f;  // Σ (dy·w)·xhat
      for (std::int64_t i = 0; i < H; ++i) {
        const float xhat = xr[i] * inv;
        dot += gr[i] * wp[i] * xhat;
        dwp[i] += gr[i] * xhat;
      }
      const float mean = dot / static_cast<float>(H);
      float* dxr = dxp + r * H;
      for (std::int64_t i = 0; i < H; ++i) {
        const float v = inv * (gr[i] * wp[i] - xr[i] * inv * mean);
        dxr[i] = accumulate_dx ? dxr[i] + v : v;
      }
    }
  });
  float* dwo = dw.f32();
  for (int t = 0; t < nt; ++t)
    for (std::int64_t i = 0; i < H; ++i) dwo[i] += partial[static_cast<std::size_t>(t) * H + i];
}

}  // namespace scalelab::kernels
