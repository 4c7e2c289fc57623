// RMSNorm fused with the residual add (fused.h). The LayerNorm forms live in cpu/layernorm.cpp.
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/fused_vec.h"
#include "kernels/fused.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

// y = w · (h · inv): the expression rmsnorm_forward uses, shared by forward and recompute.
inline void write_row(float* __restrict y, const float* __restrict h, float inv, const float* __restrict w,
                      std::int64_t H) {
  for (std::int64_t i = 0; i < H; ++i) y[i] = w[i] * (h[i] * inv);
}

std::int64_t check_rms(const Tensor& h, const Tensor& y, const Tensor& rstd, const Tensor& w, const char* op) {
  require_cpu(h, op);
  require_dtype(h, DType::kF32, op, "input");
  const std::int64_t H = w.numel(), rows = h.numel() / H;
  SCALELAB_CHECK(H > 0 && h.dim(-1) == H,
                 std::string("[") + op + "] input " + h.shape().str() + " does not end in the weight's " +
                     std::to_string(H));
  require_numel(y, rows * H, op, "output");
  require_numel(rstd, rows, op, "rstd");
  return rows;
}

}  // namespace

void rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                              const Tensor& w, float eps, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  const char* op = "rmsnorm_residual_forward";
  const std::int64_t rows = check_rms(x, y, rstd, w, op), H = w.numel();
  require_numel(delta, rows * H, op, "residual delta");
  require_numel(h, rows * H, op, "residual output");
  const float* xp = x.f32();
  const float* dp = delta.f32();
  const float* wp = w.f32();
  float* hp = h.f32();
  float* yp = y.f32();
  float* rp = rstd.f32();
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      float* hr = hp + r * H;
      const float ss = vec::add_sumsq(hr, xp + r * H, dp + r * H, H);
      const float inv = 1.0f / std::sqrt(ss * inv_h + eps);
      rp[r] = inv;
      write_row(yp + r * H, hr, inv, wp, H);
    }
  });
}

void rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h, const Tensor& rstd,
                               const Tensor& w, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "rmsnorm_residual_backward";
  const std::int64_t rows = check_rms(h, dy, rstd, w, op), H = w.numel();
  require_numel(dh, rows * H, op, "residual gradient");
  require_numel(dw, H, op, "weight gradient");
  const float* hp = h.f32();
  const float* wp = w.f32();
  const float* gp = dy.f32();
  const float* rp = rstd.f32();
  float* dhp = dh.f32();
  // Weight gradients: one partial row per thread, summed in thread order (deterministic).
  const int nt = num_threads();
  std::vector<float> partial(static_cast<std::size_t>(nt) * H, 0.0f);
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    float* pw = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * H;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* hr = hp + r * H;
      const float* gr = gp + r * H;
      const float inv = rp[r];
      // One read of the row for Σ (dy·w)·h and the weight-gradient partial dy·h·rstd.
      float acc = 0.0f;
      std::int64_t i = 0;
#ifdef SCALELAB_AVX2
      {
        __m256 a = _mm256_setzero_ps();
        const __m256 iv = _mm256_set1_ps(inv);
        for (; i + 8 <= H; i += 8) {
          const __m256 g = _mm256_loadu_ps(gr + i), x = _mm256_loadu_ps(hr + i);
          a = _mm256_fmadd_ps(_mm256_mul_ps(g, _mm256_loadu_ps(wp + i)), x, a);
          _mm256_storeu_ps(pw + i, _mm256_fmadd_ps(g, _mm256_mul_ps(x, iv), _mm256_loadu_ps(pw + i)));
        }
        acc = vec::hsum8(a);
      }
#endif
      for (; i < H; ++i) {
        acc += gr[i] * wp[i] * hr[i];
        pw[i] += gr[i] * (hr[i] * inv);
      }
      // m = mean(dy·w·xhat) = acc·rstd/H with xhat = h·rstd; dh += rstd·(dy·w − xhat·m), and
      // rstd·xhat·m = h·(acc·rstd³/H).
      const float c = acc * inv_h * (inv * inv * inv);
      float* dr = dhp + r * H;
      for (std::int64_t j = 0; j < H; ++j) dr[j] += inv * (gr[j] * wp[j]) - hr[j] * c;
    }
  });
  float* dwo = dw.f32();
  for (int t = 0; t < nt; ++t)
    for (std::int64_t i = 0; i < H; ++i) dwo[i] += partial[static_cast<std::size_t>(t) * H + i];
}

void rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const std::int64_t rows = check_rms(h, y, rstd, w, "rmsnorm_recompute"), H = w.numel();
  const float* hp = h.f32();
  const float* wp = w.f32();
  const float* rp = rstd.f32();
  float* yp = y.f32();
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) write_row(yp + r * H, hp + r * H, rp[r], wp, H);
  });
}

}  // namespace scalelab::kernels
