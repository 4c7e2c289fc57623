// LayerNorm, plain (layernorm.h) and fused with the residual add (fused.h): one row loop serves
// both, the fused form only adds delta while it sums the row.
// Tensors may be fp32, bf16 or fp16 (statistics fp32): rows are staged through per-thread fp32
// buffers (stage.h), which for fp32 are the tensors themselves. A low-precision residual h is
// rounded to its storage dtype before it is normalized, so the fused form computes exactly what
// add_ followed by layernorm_forward does.
#include "kernels/layernorm.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/fused_vec.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels::cpu {

namespace {

// An optional parameter row (w or b) as fp32: the tensor itself, or converted into `buf`.
const float* optional_f32(const Tensor& t, std::int64_t n, std::vector<float>& buf) {
  if (!t.defined()) return nullptr;
  if (t.dtype() == DType::kF32) return t.f32();
  buf.resize(static_cast<std::size_t>(n));
  convert(t.raw(), t.dtype(), buf.data(), DType::kF32, static_cast<std::size_t>(n));
  return buf.data();
}

Tensor* optional_grad(Tensor* t) { return t == nullptr || !t->defined() ? nullptr : t; }

// g += partial (n floats), g of any float dtype.
void accumulate_into(Tensor& g, const float* partial, std::int64_t n) {
  float* row = inout_row(g.raw(), g.dtype(), n, 0);
  for (std::int64_t i = 0; i < n; ++i) row[i] += partial[i];
  store_row(row, g.raw(), g.dtype(), n);
}

// y = (src − m) · inv [· w] [+ b]; the one expression forward and recompute share (bit-identical).
inline void write_row(float* __restrict y, const float* __restrict src, float m, float inv, const float* w,
                      const float* b, std::int64_t H) {
  if (w && b) {
    for (std::int64_t i = 0; i < H; ++i) y[i] = (src[i] - m) * inv * w[i] + b[i];
  } else if (w) {
    for (std::int64_t i = 0; i < H; ++i) y[i] = (src[i] - m) * inv * w[i];
  } else if (b) {
    for (std::int64_t i = 0; i < H; ++i) y[i] = (src[i] - m) * inv + b[i];
  } else {
    for (std::int64_t i = 0; i < H; ++i) y[i] = (src[i] - m) * inv;
  }
}

// Forward over all rows. With delta, h = x + delta is written first and normalized.
void forward_impl(Tensor* h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor* delta,
                  const Tensor& w, const Tensor& b, float eps) {
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  std::vector<float> wbuf, bbuf;
  const float* wp = optional_f32(w, H, wbuf);
  const float* bp = optional_f32(b, H, bbuf);
  float* mp = mean.f32();
  float* rp = rstd.f32();
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* src = load_row(elem(x.raw(), x.dtype(), r * H), x.dtype(), H, 0);
      float s;
      if (delta != nullptr) {
        const float* dr = load_row(elem(delta->raw(), delta->dtype(), r * H), delta->dtype(), H, 1);
        void* hdst = elem(h->raw(), h->dtype(), r * H);
        float* hr = out_row(hdst, h->dtype(), H, 2);
        s = vec::add_sum(hr, src, dr, H);
        if (h->dtype() != DType::kF32) {
          // Normalize the stored (rounded) residual, as add_ + layernorm_forward would.
          store_row(hr, hdst, h->dtype(), H);
          convert(hdst, h->dtype(), hr, DType::kF32, static_cast<std::size_t>(H));
          s = vec::sum(hr, H);
        }
        src = hr;
      } else {
        s = vec::sum(src, H);
      }
      const float m = s * inv_h;
      const float inv = 1.0f / std::sqrt(vec::sumsq_centered(src, m, H) * inv_h + eps);
      mp[r] = m;
      rp[r] = inv;
      void* ydst = elem(y.raw(), y.dtype(), r * H);
      float* yr = out_row(ydst, y.dtype(), H, 3);
      write_row(yr, src, m, inv, wp, bp, H);
      store_row(yr, ydst, y.dtype(), H);
    }
  });
}

// dx (= or +=) rstd · (g − mean(g) − xhat · mean(g · xhat)),  g = dy · w,  xhat = (x − mean) · rstd;
// dw += Σ dy · xhat, db += Σ dy, through per-thread partial rows summed in thread order.
void backward_impl(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                   const Tensor& rstd, const Tensor& w, bool accumulate_dx) {
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  std::vector<float> wbuf;
  const float* wp = optional_f32(w, H, wbuf);
  Tensor* dwo = optional_grad(dw);
  Tensor* dbo = optional_grad(db);
  const float* mp = mean.f32();
  const float* rp = rstd.f32();
  const int nt = num_threads();
  // Partial rows: [thread][dw | db].
  std::vector<float> partial(static_cast<std::size_t>(nt) * 2 * H, 0.0f);
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    float* pw = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * 2 * H;
    float* pb = pw + H;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * H), x.dtype(), H, 0);
      const float* gr = load_row(elem(dy.raw(), dy.dtype(), r * H), dy.dtype(), H, 1);
      const float m = mp[r], inv = rp[r];
      float sum_g = 0.0f, sum_gx = 0.0f;  // Σ g, Σ g·xhat
      std::int64_t i = 0;
#ifdef SCALELAB_AVX2
      {
        __m256 ag = _mm256_setzero_ps(), agx = _mm256_setzero_ps();
        const __m256 mv = _mm256_set1_ps(m), iv = _mm256_set1_ps(inv);
        for (; i + 8 <= H; i += 8) {
          const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), mv), iv);
          const __m256 d = _mm256_loadu_ps(gr + i);
          const __m256 g = wp ? _mm256_mul_ps(d, _mm256_loadu_ps(wp + i)) : d;
          ag = _mm256_add_ps(ag, g);
          agx = _mm256_fmadd_ps(g, xh, agx);
          _mm256_storeu_ps(pw + i, _mm256_fmadd_ps(d, xh, _mm256_loadu_ps(pw + i)));
          _mm256_storeu_ps(pb + i, _mm256_add_ps(d, _mm256_loadu_ps(pb + i)));
        }
        sum_g = vec::hsum8(ag);
        sum_gx = vec::hsum8(agx);
      }
#endif
      for (; i < H; ++i) {
        const float xh = (xr[i] - m) * inv;
        const float g = wp ? gr[i] * wp[i] : gr[i];
        sum_g += g;
        sum_gx += g * xh;
        pw[i] += gr[i] * xh;
        pb[i] += gr[i];
      }
      const float a = sum_g * inv_h, c = sum_gx * inv_h;
      void* ddst = elem(dx.raw(), dx.dtype(), r * H);
      float* dxr = accumulate_dx ? inout_row(ddst, dx.dtype(), H, 2) : out_row(ddst, dx.dtype(), H, 2);
      for (std::int64_t j = 0; j < H; ++j) {
        const float xh = (xr[j] - m) * inv;
        const float g = wp ? gr[j] * wp[j] : gr[j];
        const float v = inv * (g - a - xh * c);
        dxr[j] = accumulate_dx ? dxr[j] + v : v;
      }
      store_row(dxr, ddst, dx.dtype(), H);
    }
  });
  // Thread partials summed in thread order, then added to the gradients once.
  for (int t = 1; t < nt; ++t) {
    const float* pw = partial.data() + static_cast<std::size_t>(t) * 2 * H;
    for (std::int64_t i = 0; i < 2 * H; ++i) partial[static_cast<std::size_t>(i)] += pw[i];
  }
  if (dwo) accumulate_into(*dwo, partial.data(), H);
  if (dbo) accumulate_into(*dbo, partial.data() + H, H);
}

}  // namespace

void CpuBackend::layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                                   const Tensor& b, float eps, ExecContext&) {
  forward_impl(nullptr, y, mean, rstd, x, nullptr, w, b, eps);
}

void CpuBackend::layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x,
                                    const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext&,
                                    bool accumulate_dx) {
  backward_impl(dx, dw, db, dy, x, mean, rstd, w, accumulate_dx);
}

void CpuBackend::layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                            const Tensor& delta, const Tensor& w, const Tensor& b, float eps,
                                            ExecContext&) {
  forward_impl(&h, y, mean, rstd, x, &delta, w, b, eps);
}

void CpuBackend::layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                             const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext&) {
  backward_impl(dh, dw, db, dy, h, mean, rstd, w, /*accumulate_dx=*/true);
}

void CpuBackend::layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& w, const Tensor& b, ExecContext&) {
  const std::int64_t H = h.dim(-1), rows = h.numel() / H;
  std::vector<float> wbuf, bbuf;
  const float* wp = optional_f32(w, H, wbuf);
  const float* bp = optional_f32(b, H, bbuf);
  const float* mp = mean.f32();
  const float* rp = rstd.f32();
  parallel_for(rows, row_grain(H), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* hr = load_row(elem(h.raw(), h.dtype(), r * H), h.dtype(), H, 0);
      void* ydst = elem(y.raw(), y.dtype(), r * H);
      float* yr = out_row(ydst, y.dtype(), H, 1);
      write_row(yr, hr, mp[r], rp[r], wp, bp, H);
      store_row(yr, ydst, y.dtype(), H);
    }
  });
}

}  // namespace scalelab::kernels::cpu
