#pragma once
// Linear layers (matmul family), through BLAS (OpenBLAS sgemm) on the CPU.
//
//   linear_forward:  y[T, out] = x[T, in] · w[out, in]^T (+ bias[out])
//   linear_backward: dx[T, in] = dy · w            (activation gradient: assigned, or added when
//                                                   accumulate_dx is true)
//                    dw[out, in] += dy^T · x       (parameter gradient: accumulates)
//                    dbias[out]  += Σ_t dy[t]      (accumulates)
// Weights use the Hugging Face [out, in] layout. x and y may have any leading shape; the last
// dimension is the feature dimension. Each tensor may be fp32, bf16 or fp16 (mixed freely):
// products are computed in fp32 (sgemm); low-precision operands are converted panel by panel
// into fp32 workspace taken from the device-memory allocator.
#include <vector>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx);

// dx may be null (no input gradient needed, e.g. the first layer's input is an embedding that
// gets its gradient elsewhere). dbias may be null when there is no bias. dw may be undefined (a
// frozen weight, --freeze): every backend then skips the weight-gradient GEMM and its workspace
// (an undefined *dbias skips the bias gradient the same way).
void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w,
                     ExecContext& ctx, bool accumulate_dx = false);

// Row-major C[m,n] = alpha * op(A) · op(B) + beta * C with explicit leading dimensions: the one
// GEMM entry point of the CPU kernels (attention calls it on sub-matrices of packed buffers).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// The same over operands of any float dtype (element strides in elements of each dtype).
void gemm_ex(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
             DType a_type, std::int64_t lda, const void* b, DType b_type, std::int64_t ldb, float beta, void* c,
             DType c_type, std::int64_t ldc, ExecContext& ctx);

// One gemm_ex call's arguments (for gemm_ex_group).
struct GemmExArgs {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const void* a = nullptr;
  DType a_type = DType::kF32;
  std::int64_t lda = 0;
  const void* b = nullptr;
  DType b_type = DType::kF32;
  std::int64_t ldb = 0;
  float beta = 0.0f;
  void* c = nullptr;
  DType c_type = DType::kF32;
  std::int64_t ldc = 0;
};

// Independent products: none writes memory that another reads or writes. The result is that of
// gemm_ex on each, in any order; a backend may run them concurrently. The CPU does when every
// operand is fp32 (no workspace) and it has several threads: each product on one thread, several
// at once — small and skinny products (LoRA's rank-r ones) gain little from splitting one product
// over the threads, and a group keeps every thread busy. Others run them one after another.
void gemm_ex_group(const std::vector<GemmExArgs>& products, ExecContext& ctx);

// The fp32 workspace blocks gemm_ex allocates for these sizes and dtypes, in allocation order
// (freed in reverse), and their sum: for the memory plan.
std::vector<std::size_t> gemm_ex_workspace_blocks(std::int64_t m, std::int64_t n, std::int64_t k, DType a_type,
                                                  DType b_type, DType c_type);
std::size_t gemm_ex_workspace_bytes(std::int64_t m, std::int64_t n, std::int64_t k, DType a_type, DType b_type,
                                    DType c_type);

// The same for the CUDA backend's gemm_ex (cuda/matmul.cu), which multiplies operands of one type
// with cuBLASLt and allocates only to reconcile types: A and B of different types -> each
// low-precision operand widened whole to fp32 (A's m·k, then B's k·n floats); a C the product
// cannot write (fp32 operands into bf16/fp16, bf16 operands into fp16, ...) -> an fp32 m·n
// staging block. Same-type products allocate nothing. The meta backend plans with this rule when
// ExecContext::options.planned_device is CUDA. Kept beside the CPU's rule (not in cuda/) so that
// builds without CUDA plan for CUDA too; cuda/matmul.cu says where its allocations follow it.
std::vector<std::size_t> cuda_gemm_ex_workspace_blocks(std::int64_t m, std::int64_t n, std::int64_t k, DType a_type,
                                                       DType b_type, DType c_type);

}  // namespace scalelab::kernels
