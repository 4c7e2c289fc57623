// MLP activations fused and recomputed (fused.h): SwiGLU backward that rebuilds silu(gate)·up,
// and OPT's fc1 bias + ReLU in one pass.
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/fused.h"
#include "kernels/kernel_common.h"
#include "kernels/matmul.h"

namespace scalelab::kernels {

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

void swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  const char* op = "swiglu_backward_recompute";
  require_cpu(gu, op);
  require_dtype(gu, DType::kF32, op, "gate/up");
  const std::int64_t I = dh.dim(-1), T = dh.numel() / I;
  require_numel(gu, T * 2 * I, op, "gate/up");
  require_numel(dgu, T * 2 * I, op, "gate/up gradient");
  require_numel(act, T * I, op, "recomputed activation");
  const float* g = gu.f32();
  const float* d = dh.f32();
  float* out = dgu.f32();
  float* a = act.f32();
  parallel_for(T, 4, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* gate = g + t * 2 * I;
      const float* up = gate + I;
      const float* dr = d + t * I;
      float* dgate = out + t * 2 * I;
      float* dup = dgate + I;
      float* ar = a + t * I;
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
    }
  });
}

void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                    const Tensor& wdown, ExecContext& ctx) {
  const char* op = "swiglu_down_backward_recompute";
  require_cpu(dout, op);
  require_dtype(wdown, DType::kF32, op, "down weight");
  SCALELAB_CHECK(wdown.rank() == 2, std::string("[") + op + "] down weight must be 2-D, got " + wdown.shape().str());
  const std::int64_t H = wdown.dim(0), I = wdown.dim(1), T = dout.numel() / H;
  require_numel(dout, T * H, op, "output gradient");
  require_numel(dwdown, H * I, op, "down weight gradient");
  Tensor scratch = Tensor::empty({T, I}, DType::kF32, *ctx.alloc, "mlp activation (recomputed)");
  {
    ProfileScope prof(ctx, "matmul", Phase::kBackward);
    gemm(false, false, T, I, H, 1.0f, dout.f32(), H, wdown.f32(), I, 0.0f, scratch.f32(), I);  // dact
  }
  swiglu_backward_recompute(dgu, scratch, scratch, gu, ctx);  // scratch: dact -> act
  ProfileScope prof(ctx, "matmul", Phase::kBackward);
  gemm(true, false, H, I, T, 1.0f, dout.f32(), H, scratch.f32(), I, 1.0f, dwdown.f32(), I);
}

void bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kForward);
  const char* op = "bias_relu_forward";
  require_cpu(x, op);
  const std::int64_t F = x.dim(-1), rows = x.numel() / F;
  require_numel(y, rows * F, op, "output");
  if (b.defined()) require_numel(b, F, op, "bias");
  // Low-precision rows (bf16/fp16 storage) are staged through fp32 row buffers (stage.h).
  std::vector<float> bbuf;
  const float* bp = nullptr;
  if (b.defined() && b.dtype() == DType::kF32) {
    bp = b.f32();
  } else if (b.defined()) {
    bbuf.resize(static_cast<std::size_t>(F));
    convert(b.raw(), b.dtype(), bbuf.data(), DType::kF32, static_cast<std::size_t>(F));
    bp = bbuf.data();
  }
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
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

void bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx) {
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  const char* op = "bias_relu_backward";
  require_cpu(y, op);
  const std::int64_t F = y.dim(-1), rows = y.numel() / F;
  require_numel(dy, rows * F, op, "output gradient");
  require_numel(dx, rows * F, op, "input gradient");
  Tensor* dbo = nullptr;
  if (db != nullptr && db->defined()) {
    require_numel(*db, F, op, "bias gradient");
    dbo = db;
  }
  // Bias gradient: one partial row per thread, summed in thread order (deterministic).
  const int nt = dbo ? num_threads() : 0;
  std::vector<float> partial(static_cast<std::size_t>(nt) * F, 0.0f);
  parallel_for(rows, 16, [&](std::int64_t r0, std::int64_t r1) {
    float* pb = dbo ? partial.data() + static_cast<std::int64_t>(omp_get_thread_num()) * F : nullptr;
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
  if (dbo == nullptr) return;
  float* dbr = inout_row(dbo->raw(), dbo->dtype(), F, 3);
  for (int t = 0; t < nt; ++t)
    for (std::int64_t j = 0; j < F; ++j) dbr[j] += partial[static_cast<std::size_t>(t) * F + j];
  store_row(dbr, dbo->raw(), dbo->dtype(), F);
}

}  // namespace scalelab::kernels
