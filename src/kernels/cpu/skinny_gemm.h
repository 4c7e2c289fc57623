#pragma once
// Products with one small dimension (at most kSkinny) and a long inner dimension: the rank-r
// products of LoRA that reduce over a [T, in] or [T, out] activation (model/decoder/lora.h):
//   z  = x·Aᵀ     [T, r]       A [r, in]        (no trans_a, n small, trans_b)
//   dz = dy·B     [T, r]       B [out, r]       (no trans_a, n small)
//   dB = dyᵀ·z    [out, r]                      (trans_a, n small)
//   dA = dzᵀ·x    [r, in]                       (trans_a, m small)
// Row-major, leading dimensions as kernels::gemm. small_k_gemm.h has the other two (k small).
//
// Why by hand beside OpenBLAS: OpenBLAS 0.3.21 runs these shapes far below the machine's peak.
// Measured on the 2-core EPYC (build/bench/bench_lora_products, SmolLM2-135M's shapes, T = 1024):
// on one thread OpenBLAS runs z and dz at about 50 GFLOP/s and dB at about 32; on two threads
// anywhere from 13 to 140 from one run to the next (its split of these shapes is erratic), where
// this kernel runs them at 100–180. Here a product's rows (or its long output dimension) are split
// over the threads, each element computed by one thread. Long k with n = 32 (a QLoRA tile of a
// 8192-wide weight) is the one shape where OpenBLAS at its best is faster (~15 %).
//
// Every element is computed in one fixed order whatever the split and the thread count: the
// no-trans_a form accumulates 8 partial sums (q mod 8, fused multiply-adds in q order, k taken in
// chunks that keep each term's lane) and adds them as ((p0 + p4) + (p2 + p6)) + ((p1 + p5) +
// (p3 + p7)); the trans_a forms sum over the rows in order with fused multiply-adds. Then times alpha, plus beta·C when beta ≠ 0 (C is not read
// when beta = 0, as BLAS).
#include <cstdint>

namespace scalelab::kernels::cpu {

inline constexpr std::int64_t kSkinny = 32;

// Whether skinny_gemm takes this product: no trans_a with n <= kSkinny, or trans_a (B not
// transposed) with m or n <= kSkinny; a long inner dimension (k >= 64) and the other output
// dimension at least 16.
bool skinny_gemm_applies(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k);

// C[m, n] = alpha · op(A) · op(B) + beta · C. Runs on the OpenMP threads (one thread inside a
// parallel region).
void skinny_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc);

}  // namespace scalelab::kernels::cpu
