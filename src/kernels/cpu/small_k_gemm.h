#pragma once
// C[m, n] = alpha · A[m, k] · op(B) + beta · C for a small inner dimension k (at most kSmallK):
// LoRA's rank-r products that write a [T, out] output — the up-projection s·z·Bᵀ and the input
// gradient dz·A (model/decoder/lora.h). Row-major, leading dimensions as kernels::gemm.
//
// Why by hand beside OpenBLAS: these products only stream C. OpenBLAS (0.3.21) runs them as a
// full GEMM: with beta = 0 it first zeroes C in a separate pass, then reads and writes it again
// in its micro-kernel, three passes over a [T, out] matrix where one write suffices. With this
// kernel LoRA writes the output first (beta = 0, one pass) and the base product accumulates into
// it (beta = 1, which OpenBLAS runs without its zeroing pass): the adapter's up-projection then
// costs about one pass over y instead of two (measured in bench/lora_vs_full.py's note).
//
// Each element is Σ_q A[i, q]·B'[q, j] summed in q order with fused multiply-adds, then times
// alpha (plus beta · C when beta ≠ 0; C is not read when beta = 0, as BLAS): the same bits for
// an element wherever its row and column fall, at every thread count.
#include <cstdint>

namespace scalelab::kernels::cpu {

inline constexpr std::int64_t kSmallK = 32;

// The transpose of B [rows, cols] (leading dimension ldb) as [cols, rows], in host scratch of the
// calling thread (like OpenBLAS's packing buffers, outside the device allocator, and kept, so a
// training step's products do not allocate): valid until the thread's next call. For the small-k
// and skinny kernels, whose B has at most 32 rows or columns.
const float* transposed_scratch(const float* b, std::int64_t rows, std::int64_t cols, std::int64_t ldb);

// Whether small_k_gemm takes this product (trans_a false, 1 <= k <= kSmallK, enough rows).
bool small_k_gemm_applies(bool trans_a, std::int64_t m, std::int64_t n, std::int64_t k);

// op(B) = B [k, n] (trans_b false) or Bᵀ with B [n, k] (trans_b true). Runs on the OpenMP threads
// (one thread inside a parallel region).
void small_k_gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

}  // namespace scalelab::kernels::cpu
