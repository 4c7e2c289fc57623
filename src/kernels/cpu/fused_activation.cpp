// MLP activations fused and recomputed (fused.h): SwiGLU backward that rebuilds silu(gate)·up,
// and OPT's fc1 bias + ReLU in one pass.
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"

namespace scalelab::kernels::cpu {

namespace {

// One element of the SwiGLU backward with recompute; the expressions (and their order) are those
// of swiglu_forward / swiglu_backward, so results agree with the unfused pair to the last bits
// of exp. Reads gate, up and dh before writing anything (the outputs may alias them).
inline void swiglu_element(float* dgate, float* dup, float* act, const float* gate, const float* up,
                           const float* dh) {
  const float x = *gate, u = *up, d = *dh;
  const float s = 1.0f / (1.0f + vec::exp1(-x));
  const float silu = x * s;
  *act = x * s * u;
  *dup = d * silu;
  *dgate = d * u * s * (1.0f + x * (1.0f - s));
}

}  // namespace

void CpuBackend::swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu,
                                           ExecContext&) {
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  // Low-precision rows are staged: inputs are read into fp32 buffers before any output is
  // stored, so the aliasing the header allows holds there too.
  parallel_for(T, row_grain(2 * I), [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* gate = load_row(elem(gu.raw(), gu.dtype(), t * 2 * I), gu.dtype(), 2 * I, 0);
      const float* up = gate + I;
      const float* dr = load_row(elem(dh.raw(), dh.dtype(), t * I), dh.dtype(), I, 1);
      void* gdst = elem(dgu.raw(), dgu.dtype(), t * 2 * I);
      void* adst = elem(act.raw(), act.dtype(), t * I);
      float* dgate = out_row(gdst, dgu.dtype(), 2 * I, 2);
      float* dup = dgate + I;
      float* ar = out_row(adst, act.dtype(), I, 3);
      std::int64_t i = 0;
#ifdef SCALELAB_AVX2
      const __m256 one = _mm256_set1_ps(1.0f);
      for (; i + 8 <= I; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i), dv = _mm256_loadu_ps(dr + i);
        const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, vec::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        const __m256 silu = _mm256_mul_ps(x, s);
        const __m256 av = _mm256_mul_ps(silu, u);
        const __m256 dupv = _mm256_mul_ps(dv, silu);
        const __m256 dgv = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(dv, u), s),
                                         _mm256_add_ps(one, _mm256_mul_ps(x, _mm256_sub_ps(one, s))));
        _mm256_storeu_ps(ar + i, av);
        _mm256_storeu_ps(dup + i, dupv);
        _mm256_storeu_ps(dgate + i, dgv);
      }
#endif
      for (; i < I; ++i) swiglu_element(dgate + i, dup + i, ar + i, gate + i, up + i, dr + i);
      store_row(dgate, gdst, dgu.dtype(), 2 * I);
      store_row(ar, adst, act.dtype(), I);
    }
  });
}

// The profile books the GEMMs as matmul and the activation as activation (the front opens no
// scope for this op).
void CpuBackend::swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                                const Tensor& wdown, ExecContext& ctx) {
  const std::int64_t H = wdown.dim(0), I = wdown.dim(1), T = dout.numel() / H;
  // The scratch holds dact, then the recomputed act, in the activation dtype (what the unfused
  // MLP would have stored).
  Tensor scratch = Tensor::empty({T, I}, dout.dtype(), *ctx.alloc, "mlp activation (recomputed)");
  {
    ProfileScope prof(ctx, "matmul", Phase::kBackward);
    gemm_ex(false, false, T, I, H, 1.0f, dout.raw(), dout.dtype(), H, wdown.raw(), wdown.dtype(), I, 0.0f,
            scratch.raw(), scratch.dtype(), I, ctx);  // dact
  }
  {
    ProfileScope prof(ctx, "activation", Phase::kBackward);
    swiglu_backward_recompute(dgu, scratch, scratch, gu, ctx);  // scratch: dact -> act
  }
  if (!dwdown.defined()) return;  // a frozen down_proj: no weight gradient
  ProfileScope prof(ctx, "matmul", Phase::kBackward);
  gemm_ex(true, false, H, I, T, 1.0f, dout.raw(), dout.dtype(), H, scratch.raw(), scratch.dtype(), I, 1.0f,
          dwdown.raw(), dwdown.dtype(), I, ctx);
}

void CpuBackend::bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext&) {
  const std::int64_t F = x.dim(-1), rows = x.numel() / F;
  parallel_for(rows, row_grain(F), [&](std::int64_t r0, std::int64_t r1) {
    const float* bp = b.defined() ? load_row(b.raw(), b.dtype(), F, 2) : nullptr;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * F), x.dtype(), F, 0);
      void* ydst = elem(y.raw(), y.dtype(), r * F);
      float* yr = out_row(ydst, y.dtype(), F, 1);
      // `v < 0 ? 0 : v` keeps a NaN as NaN, like torch.relu.
      if (bp) {
        for (std::int64_t j = 0; j < F; ++j) {
          const float v = xr[j] + bp[j];
          yr[j] = v < 0.0f ? 0.0f : v;
        }
      } else {
        for (std::int64_t j = 0; j < F; ++j) {
          const float v = xr[j];
          yr[j] = v < 0.0f ? 0.0f : v;
        }
      }
      store_row(yr, ydst, y.dtype(), F);
    }
  });
}

void CpuBackend::bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext&) {
  const std::int64_t F = y.dim(-1), rows = y.numel() / F;
  const bool want_db = db != nullptr && db->defined();
  // Bias gradient: one fp32 partial row per thread, summed in thread order (deterministic).
  const int nt = want_db ? num_threads() : 0;
  std::vector<float> partial(static_cast<std::size_t>(nt) * F, 0.0f);
  parallel_for(rows, row_grain(F), [&](std::int64_t r0, std::int64_t r1) {
    float* pb = want_db ? partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * F : nullptr;
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* yr = load_row(elem(y.raw(), y.dtype(), r * F), y.dtype(), F, 0);
      const float* gr = load_row(elem(dy.raw(), dy.dtype(), r * F), dy.dtype(), F, 1);
      void* ddst = elem(dx.raw(), dx.dtype(), r * F);
      float* dr = out_row(ddst, dx.dtype(), F, 2);
      if (pb) {
        for (std::int64_t j = 0; j < F; ++j) {
          const float v = yr[j] > 0.0f ? gr[j] : 0.0f;
          dr[j] = v;
          pb[j] += v;
        }
      } else {
        for (std::int64_t j = 0; j < F; ++j) dr[j] = yr[j] > 0.0f ? gr[j] : 0.0f;
      }
      store_row(dr, ddst, dx.dtype(), F);
    }
  });
  if (!want_db) return;
  for (int t = 1; t < nt; ++t)
    for (std::int64_t j = 0; j < F; ++j) partial[static_cast<std::size_t>(j)] += partial[static_cast<std::size_t>(t) * F + j];
  float* dbo = inout_row(db->raw(), db->dtype(), F, 0);
  for (std::int64_t j = 0; j < F; ++j) dbo[j] += partial[static_cast<std::size_t>(j)];
  store_row(dbo, db->raw(), db->dtype(), F);
}

}  // namespace scalelab::kernels::cpu
