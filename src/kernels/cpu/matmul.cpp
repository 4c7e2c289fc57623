#include "kernels/matmul.h"

#include <cblas.h>

#include <cstring>

#include "core/parallel.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS leaves C untouched when k == 0 only if beta == 1; make the definition explicit.
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

namespace {

struct LinearDims {
  std::int64_t tokens, in, out;
};

LinearDims check_linear(const Tensor& y, const Tensor& x, const Tensor& w, const char* op) {
  require_cpu(x, op);
  require_cpu(w, op);
  require_cpu(y, op);
  require_dtype(x, DType::kF32, op, "input");
  require_dtype(w, DType::kF32, op, "weight");
  require_dtype(y, DType::kF32, op, "output");
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] weight must be 2-D, got " + w.shape().str());
  const std::int64_t out = w.dim(0), in = w.dim(1);
  SCALELAB_CHECK(x.rank() >= 1 && x.dim(-1) == in,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in " + std::to_string(in));
  const std::int64_t tokens = x.numel() / in;
  require_numel(y, tokens * out, op, "output");
  return {tokens, in, out};
}

}  // namespace

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) {
  ProfileScope prof(ctx, "matmul", Phase::kForward);
  const auto d = check_linear(y, x, w, "linear_forward");
  float* yp = y.f32();
  gemm(false, true, d.tokens, d.out, d.in, 1.0f, x.f32(), d.in, w.f32(), d.in, 0.0f, yp, d.out);
  if (bias != nullptr && bias->defined()) {
    require_numel(*bias, d.out, "linear_forward", "bias");
    const float* b = bias->f32();
    parallel_for(d.tokens, 64, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) {
        float* row = yp + t * d.out;
        for (std::int64_t j = 0; j < d.out; ++j) row[j] += b[j];
      }
    });
  }
}

void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w,
                     ExecContext& ctx, bool accumulate_dx) {
  ProfileScope prof(ctx, "matmul", Phase::kBackward);
  const auto d = check_linear(dy, x, w, "linear_backward");
  require_numel(dw, d.out * d.in, "linear_backward", "weight gradient");
  if (dx != nullptr) {
    require_numel(*dx, d.tokens * d.in, "linear_backward", "input gradient");
    gemm(false, false, d.tokens, d.in, d.out, 1.0f, dy.f32(), d.out, w.f32(), d.in, accumulate_dx ? 1.0f : 0.0f,
         dx->f32(), d.in);
  }
  gemm(true, false, d.out, d.in, d.tokens, 1.0f, dy.f32(), d.out, x.f32(), d.in, 1.0f, dw.f32(), d.in);
  if (dbias != nullptr && dbias->defined()) {
    require_numel(*dbias, d.out, "linear_backward", "bias gradient");
    float* db = dbias->f32();
    const float* g = dy.f32();
    // Column sums, split over columns so threads never share an output.
    parallel_for(d.out, 256, [&](std::int64_t j0, std::int64_t j1) {
      for (std::int64_t t = 0; t < d.tokens; ++t) {
        const float* row = g + t * d.out;
        for (std::int64_t j = j0; j < j1; ++j) db[j] += row[j];
      }
    });
  }
}

}  // namespace scalelab::kernels
