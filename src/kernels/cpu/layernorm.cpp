// LayerNorm, plain (layernorm.h) and fused with the residual add (fused.h): one row loop serves
// both, the fused form only adds delta while it sums the row.
#include "kernels/layernorm.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/fused_vec.h"
#include "kernels/fused.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

const float* optional_f32(const Tensor& t, std::int64_t n, const char* op, const char* name) {
  if (!t.defined()) return nullptr;
  require_numel(t, n, op, name);
  return t.f32();
}

float* optional_grad(Tensor* t, std::int64_t n, const char* op, const char* name) {
  if (t == nullptr || !t->defined()) return nullptr;
  require_numel(*t, n, op, name);
  return t->f32();
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
                  const Tensor& w, const Tensor& b, float eps, ExecContext& ctx, const char* op) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  require_cpu(x, op);
  require_dtype(x, DType::kF32, op, "input");
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  require_numel(y, rows * H, op, "output");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  const float* wp = optional_f32(w, H, op, "weight");
  const float* bp = optional_f32(b, H, op, "bias");
  const float* xp = x.f32();
  const float* dp = nullptr;
  float* hp = nullptr;
  if (delta != nullptr) {
    require_numel(*delta, rows * H, op, "residual delta");
    require_numel(*h, rows * H, op, "residual output");
    dp = delta->f32();
    hp = h->f32();
  }
  float* yp = y.f32();
  float* mp = mean.f32();
  float* rp = rstd.f32();
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* src = xp + r * H;
      float s;
      if (dp != nullptr) {
        float* hr = hp + r * H;
        s = vec::add_sum(hr, src, dp + r * H, H);
        src = hr;
      } else {
        s = vec::sum(src, H);
      }
      const float m = s * inv_h;
      const float inv = 1.0f / std::sqrt(vec::sumsq_centered(src, m, H) * inv_h + eps);
      mp[r] = m;
      rp[r] = inv;
      write_row(yp + r * H, src, m, inv, wp, bp, H);
    }
  });
}

// dx (= or +=) rstd · (g − mean(g) − xhat · mean(g · xhat)),  g = dy · w,  xhat = (x − mean) · rstd;
// dw += Σ dy · xhat, db += Σ dy, through per-thread partial rows summed in thread order.
void backward_impl(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                   const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx, const char* op) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  require_cpu(x, op);
  require_dtype(x, DType::kF32, op, "input");
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  require_numel(dx, rows * H, op, "input gradient");
  require_numel(dy, rows * H, op, "output gradient");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  const float* wp = optional_f32(w, H, op, "weight");
  float* dwo = optional_grad(dw, H, op, "weight gradient");
  float* dbo = optional_grad(db, H, op, "bias gradient");
  const float* xp = x.f32();
  const float* gp = dy.f32();
  const float* mp = mean.f32();
  const float* rp = rstd.f32();
  float* dxp = dx.f32();
  const int nt = num_threads();
  // Partial rows: [thread][dw | db].
  std::vector<float> partial(static_cast<std::size_t>(nt) * 2 * H, 0.0f);
  const float inv_h = 1.0f / static_cast<float>(H);
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    float* pw = partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * 2 * H;
    float* pb = pw + H;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * H;
      const float* gr = gp + r * H;
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
      float* dxr = dxp + r * H;
      for (std::int64_t j = 0; j < H; ++j) {
        const float xh = (xr[j] - m) * inv;
        const float g = wp ? gr[j] * wp[j] : gr[j];
        const float v = inv * (g - a - xh * c);
        dxr[j] = accumulate_dx ? dxr[j] + v : v;
      }
    }
  });
  for (int t = 0; t < nt; ++t) {
    const float* pw = partial.data() + static_cast<std::size_t>(t) * 2 * H;
    if (dwo)
      for (std::int64_t i = 0; i < H; ++i) dwo[i] += pw[i];
    if (dbo)
      for (std::int64_t i = 0; i < H; ++i) dbo[i] += pw[H + i];
  }
}

}  // namespace

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps, ExecContext& ctx) {
  forward_impl(nullptr, y, mean, rstd, x, nullptr, w, b, eps, ctx, "layernorm_forward");
}

void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                        const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx) {
  backward_impl(dx, dw, db, dy, x, mean, rstd, w, ctx, accumulate_dx, "layernorm_backward");
}

void layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                const Tensor& delta, const Tensor& w, const Tensor& b, float eps, ExecContext& ctx) {
  forward_impl(&h, y, mean, rstd, x, &delta, w, b, eps, ctx, "layernorm_residual_forward");
}

void layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  backward_impl(dh, dw, db, dy, h, mean, rstd, w, ctx, /*accumulate_dx=*/true, "layernorm_residual_backward");
}

void layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         const Tensor& b, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "layernorm_recompute";
  require_cpu(h, op);
  const std::int64_t H = h.dim(-1), rows = h.numel() / H;
  require_numel(y, rows * H, op, "output");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  const float* wp = optional_f32(w, H, op, "weight");
  const float* bp = optional_f32(b, H, op, "bias");
  const float* hp = h.f32();
  const float* mp = mean.f32();
  const float* rp = rstd.f32();
  float* yp = y.f32();
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) write_row(yp + r * H, hp + r * H, mp[r], rp[r], wp, bp, H);
  });
}

}  // namespace scalelab::kernels
