// RMSNorm on the CPU (norm.h).
#include "kernels/norm.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels::cpu {

void CpuBackend::rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps,
                                 ExecContext&) {
  const std::int64_t H = w.numel(), rows = x.numel() / H;
  float* rp = rstd.f32();
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    const float* wp = load_row(w.raw(), w.dtype(), H, 1);
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * H), x.dtype(), H, 0);
      float ss = 0.0f;
      for (std::int64_t i = 0; i < H; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
      rp[r] = inv;
      void* ydst = elem(y.raw(), y.dtype(), r * H);
      float* yr = out_row(ydst, y.dtype(), H, 2);
      for (std::int64_t i = 0; i < H; ++i) yr[i] = wp[i] * (xr[i] * inv);
      store_row(yr, ydst, y.dtype(), H);
    }
  });
}

void CpuBackend::rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                  const Tensor& w, ExecContext&, bool accumulate_dx) {
  const std::int64_t H = w.numel(), rows = x.numel() / H;
  const float* rp = rstd.f32();
  // Weight gradients: one fp32 partial row per thread, summed in thread order (deterministic).
  const int nt = num_threads();
  std::vector<float> partial(static_cast<std::size_t>(nt) * H, 0.0f);
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    float* dwp = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * H;
    const float* wp = load_row(w.raw(), w.dtype(), H, 3);
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * H), x.dtype(), H, 0);
      const float* gr = load_row(elem(dy.raw(), dy.dtype(), r * H), dy.dtype(), H, 1);
      const float inv = rp[r];
      float dot = 0.0f;  // Σ (dy·w)·xhat
      for (std::int64_t i = 0; i < H; ++i) {
        const float xhat = xr[i] * inv;
        dot += gr[i] * wp[i] * xhat;
        dwp[i] += gr[i] * xhat;
      }
      const float mean = dot / static_cast<float>(H);
      void* ddst = elem(dx.raw(), dx.dtype(), r * H);
      float* dxr = accumulate_dx ? inout_row(ddst, dx.dtype(), H, 2) : out_row(ddst, dx.dtype(), H, 2);
      for (std::int64_t i = 0; i < H; ++i) {
        const float v = inv * (gr[i] * wp[i] - xr[i] * inv * mean);
        dxr[i] = accumulate_dx ? dxr[i] + v : v;
      }
      store_row(dxr, ddst, dx.dtype(), H);
    }
  });
  if (!dw.defined()) return;  // a frozen weight: no gradient
  for (int t = 1; t < nt; ++t)
    for (std::int64_t i = 0; i < H; ++i) partial[static_cast<std::size_t>(i)] += partial[static_cast<std::size_t>(t) * H + i];
  float* dwo = inout_row(dw.raw(), dw.dtype(), H, 0);
  for (std::int64_t i = 0; i < H; ++i) dwo[i] += partial[static_cast<std::size_t>(i)];
  store_row(dwo, dw.raw(), dw.dtype(), H);
}

}  // namespace scalelab::kernels::cpu
