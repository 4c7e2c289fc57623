// Front of the matmul family (matmul.h): validation, profiling, dispatch to the tensors' backend.
#include "kernels/matmul.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

struct LinearDims {
  std::int64_t tokens, in, out;
};

LinearDims check_linear(const Tensor& y, const Tensor& x, const Tensor& w, const char* op) {
  SCALELAB_CHECK(is_float_type(x.dtype()) && is_float_type(w.dtype()) && is_float_type(y.dtype()),
                 std::string("[") + op + "] tensors must be fp32, bf16 or fp16");
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] weight must be 2-D, got " + w.shape().str());
  const std::int64_t out = w.dim(0), in = w.dim(1);
  SCALELAB_CHECK(x.rank() >= 1 && x.dim(-1) == in,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in " + std::to_string(in));
  const std::int64_t tokens = x.numel() / in;
  require_numel(y, tokens * out, op, "output");
  return {tokens, in, out};
}

}  // namespace

std::vector<std::size_t> cuda_gemm_ex_workspace_blocks(std::int64_t m, std::int64_t n, std::int64_t k, DType at,
                                                       DType bt, DType ct) {
  std::vector<std::size_t> blocks;
  if (m == 0 || n == 0 || k == 0) return blocks;  // k == 0: C = beta·C in place
  DType ab = at;
  if (at != bt) {
    ab = DType::kF32;
    if (at != DType::kF32) blocks.push_back(static_cast<std::size_t>(m * k) * sizeof(float));
    if (bt != DType::kF32) blocks.push_back(static_cast<std::size_t>(k * n) * sizeof(float));
  }
  if (!(ct == DType::kF32 || ct == ab)) blocks.push_back(static_cast<std::size_t>(m * n) * sizeof(float));
  return blocks;
}

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) {
  ProfileScope prof(ctx, "matmul", Phase::kForward);
  const char* op = "linear_forward";
  const auto d = check_linear(y, x, w, op);
  if (bias != nullptr && bias->defined()) require_numel(*bias, d.out, op, "bias");
  backend_for(device_of(op, {&y, &x, &w, bias}), op).linear_forward(y, x, w, bias, ctx);
}

void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w,
                     ExecContext& ctx, bool accumulate_dx) {
  ProfileScope prof(ctx, "matmul", Phase::kBackward);
  const char* op = "linear_backward";
  const auto d = check_linear(dy, x, w, op);
  if (dw.defined()) require_numel(dw, d.out * d.in, op, "weight gradient");  // undefined: frozen, skipped
  if (dx != nullptr) require_numel(*dx, d.tokens * d.in, op, "input gradient");
  if (dbias != nullptr && dbias->defined()) require_numel(*dbias, d.out, op, "bias gradient");
  backend_for(device_of(op, {dx, &dw, dbias, &dy, &x, &w}), op)
      .linear_backward(dx, dw, dbias, dy, x, w, ctx, accumulate_dx);
}

namespace {
void check_gemm_ex(const char* op, std::int64_t m, std::int64_t n, std::int64_t k, DType at, DType bt, DType ct) {
  SCALELAB_CHECK(is_float_type(at) && is_float_type(bt) && is_float_type(ct),
                 std::string("[") + op + "] operands must be fp32, bf16 or fp16");
  SCALELAB_CHECK(m >= 0 && n >= 0 && k >= 0, std::string("[") + op + "] negative size " + std::to_string(m) + " x " +
                                                  std::to_string(n) + " x " + std::to_string(k));
}
}  // namespace

void gemm_ex(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, DType at,
             std::int64_t lda, const void* b, DType bt, std::int64_t ldb, float beta, void* c, DType ct,
             std::int64_t ldc, ExecContext& ctx) {
  const char* op = "gemm_ex";
  check_gemm_ex(op, m, n, k, at, bt, ct);
  // Raw pointers carry no device: they live on the context's.
  backend_for(ctx.device(), op).gemm_ex(ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, ctx);
}

void gemm_ex_group(const std::vector<GemmExArgs>& products, ExecContext& ctx) {
  const char* op = "gemm_ex_group";
  for (const GemmExArgs& g : products) check_gemm_ex(op, g.m, g.n, g.k, g.a_type, g.b_type, g.c_type);
  if (products.empty()) return;
  backend_for(ctx.device(), op).gemm_ex_group(products, ctx);
}

}  // namespace scalelab::kernels
