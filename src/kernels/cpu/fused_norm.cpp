// RMSNorm fused with the residual add (fused.h). The LayerNorm forms live in cpu/layernorm.cpp.
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/fused_vec.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels::cpu {

namespace {

// y = w · (h · inv): the expression rmsnorm_forward uses, shared by forward and recompute.
inline void write_row(float* __restrict y, const float* __restrict h, float inv, const float* __restrict w,
                      std::int64_t H) {
  for (std::int64_t i = 0; i < H; ++i) y[i] = w[i] * (h[i] * inv);
}

// Rows of an RMSNorm over w's width (validated by the front).
std::int64_t rms_rows(const Tensor& h, const Tensor& w) { return h.numel() / w.numel(); }

}  // namespace

void CpuBackend::rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                                          const Tensor& w, float eps, ExecContext&) {
  const std::int64_t rows = rms_rows(x, w), H = w.numel();
  float* rp = rstd.f32();
  const float inv_h = 1.0f / static_cast<float>(H);
  // Rows are staged through fp32 buffers for bf16/fp16 tensors (pointers pass through for fp32,
  // where h may alias x or delta as add_sumsq reads each element before writing it).
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    const float* wp = load_row(w.raw(), w.dtype(), H, 3);
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * H), x.dtype(), H, 0);
      const float* dr = load_row(elem(delta.raw(), delta.dtype(), r * H), delta.dtype(), H, 1);
      void* hdst = elem(h.raw(), h.dtype(), r * H);
      float* hr = out_row(hdst, h.dtype(), H, 2);
      const float ss = vec::add_sumsq(hr, xr, dr, H);
      store_row(hr, hdst, h.dtype(), H);
      // y is computed from h as stored, so recompute rebuilds it bit for bit.
      const float* hs = h.dtype() == DType::kF32 ? hr : load_row(hdst, h.dtype(), H, 2);
      const float inv = 1.0f / std::sqrt(ss * inv_h + eps);
      rp[r] = inv;
      void* ydst = elem(y.raw(), y.dtype(), r * H);
      float* yr = out_row(ydst, y.dtype(), H, 0);
      write_row(yr, hs, inv, wp, H);
      store_row(yr, ydst, y.dtype(), H);
    }
  });
}

void CpuBackend::rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h,
                                           const Tensor& rstd, const Tensor& w, ExecContext&) {
  const std::int64_t rows = rms_rows(h, w), H = w.numel();
  const float* rp = rstd.f32();
  // Weight gradients: one partial row per thread, summed in thread order (deterministic).
  const int nt = num_threads();
  std::vector<float> partial(static_cast<std::size_t>(nt) * H, 0.0f);
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    float* pw = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * H;
    const float* wp = load_row(w.raw(), w.dtype(), H, 3);
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* hr = load_row(elem(h.raw(), h.dtype(), r * H), h.dtype(), H, 0);
      const float* gr = load_row(elem(dy.raw(), dy.dtype(), r * H), dy.dtype(), H, 1);
      void* ddst = elem(dh.raw(), dh.dtype(), r * H);
      float* dr = inout_row(ddst, dh.dtype(), H, 2);
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
      for (std::int64_t j = 0; j < H; ++j) dr[j] += inv * (gr[j] * wp[j]) - hr[j] * c;
      store_row(dr, ddst, dh.dtype(), H);
    }
  });
  if (!dw.defined()) return;  // a frozen weight: no gradient
  for (int t = 1; t < nt; ++t)
    for (std::int64_t i = 0; i < H; ++i) partial[static_cast<std::size_t>(i)] += partial[static_cast<std::size_t>(t) * H + i];
  float* dwo = inout_row(dw.raw(), dw.dtype(), H, 0);
  for (std::int64_t i = 0; i < H; ++i) dwo[i] += partial[static_cast<std::size_t>(i)];
  store_row(dwo, dw.raw(), dw.dtype(), H);
}

void CpuBackend::rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext&) {
  const std::int64_t rows = rms_rows(h, w), H = w.numel();
  const float* rp = rstd.f32();
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    const float* wp = load_row(w.raw(), w.dtype(), H, 3);
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* hr = load_row(elem(h.raw(), h.dtype(), r * H), h.dtype(), H, 0);
      void* ydst = elem(y.raw(), y.dtype(), r * H);
      float* yr = out_row(ydst, y.dtype(), H, 1);
      write_row(yr, hr, rp[r], wp, H);
      store_row(yr, ydst, y.dtype(), H);
    }
  });
}

}  // namespace scalelab::kernels::cpu
