#include "kernels/cpu/small_k_gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace scalelab::kernels::cpu {

namespace {

// One output element from its sum: alpha·s, plus beta·c when beta ≠ 0 (c unread otherwise).
inline float finish(float s, float alpha, float beta, const float* c) {
  return beta == 0.0f ? alpha * s : std::fma(beta, *c, alpha * s);
}

#ifdef SCALELAB_AVX2
inline void store8(float* c, __m256 acc, __m256 al, float beta) {
  const __m256 v = _mm256_mul_ps(al, acc);
  _mm256_storeu_ps(c, beta == 0.0f ? v : _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(c), v));
}
#endif

// Rows [0, R) of C from rows of A and B' [k, n] (row stride ldbt): columns in blocks of 16 (two
// vectors per row, 2·R accumulators), then 8, then one by one.
template <int R>
void row_block(std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* bt,
               std::int64_t ldbt, float beta, float* c, std::int64_t ldc) {
  std::int64_t j = 0;
#ifdef SCALELAB_AVX2
  const __m256 al = _mm256_set1_ps(alpha);
  for (; j + 16 <= n; j += 16) {
    __m256 lo[R], hi[R];
    for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
    for (std::int64_t q = 0; q < k; ++q) {
      const float* bq = bt + q * ldbt + j;
      const __m256 b0 = _mm256_loadu_ps(bq), b1 = _mm256_loadu_ps(bq + 8);
      for (int i = 0; i < R; ++i) {
        const __m256 av = _mm256_set1_ps(a[i * lda + q]);
        lo[i] = _mm256_fmadd_ps(av, b0, lo[i]);
        hi[i] = _mm256_fmadd_ps(av, b1, hi[i]);
      }
    }
    for (int i = 0; i < R; ++i) {
      store8(c + i * ldc + j, lo[i], al, beta);
      store8(c + i * ldc + j + 8, hi[i], al, beta);
    }
  }
  for (; j + 8 <= n; j += 8) {
    __m256 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
    for (std::int64_t q = 0; q < k; ++q) {
      const __m256 b0 = _mm256_loadu_ps(bt + q * ldbt + j);
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(a[i * lda + q]), b0, acc[i]);
    }
    for (int i = 0; i < R; ++i) store8(c + i * ldc + j, acc[i], al, beta);
  }
#endif
  for (; j < n; ++j) {
    for (int i = 0; i < R; ++i) {
      float s = 0.0f;
      for (std::int64_t q = 0; q < k; ++q) s = std::fma(a[i * lda + q], bt[q * ldbt + j], s);
      float* cp = c + i * ldc + j;
      *cp = finish(s, alpha, beta, cp);
    }
  }
}

constexpr std::int64_t kRows = 4;

}  // namespace

const float* transposed_scratch(const float* b, std::int64_t rows, std::int64_t cols, std::int64_t ldb) {
  thread_local std::vector<float> t;
  t.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) t[static_cast<std::size_t>(j * rows + i)] = b[i * ldb + j];
  return t.data();
}

bool small_k_gemm_applies(bool trans_a, std::int64_t m, std::int64_t n, std::int64_t k) {
  return !trans_a && k >= 1 && k <= kSmallK && m >= 16 && n >= 16;
}

void small_k_gemm(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  // B' = op(B) as rows of n: B itself, or Bᵀ copied once (k·n floats, at most kSmallK rows).
  const float* bt = trans_b ? transposed_scratch(b, n, k, ldb) : b;
  const std::int64_t ldbt = trans_b ? n : ldb;
  const std::int64_t blocks = (m + kRows - 1) / kRows;
  parallel_for(blocks, row_grain(kRows * n * k), [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      const std::int64_t i0 = blk * kRows, rows = std::min(kRows, m - i0);
      const float* ai = a + i0 * lda;
      float* ci = c + i0 * ldc;
      switch (rows) {
        case 4: row_block<4>(n, k, alpha, ai, lda, bt, ldbt, beta, ci, ldc); break;
        case 3: row_block<3>(n, k, alpha, ai, lda, bt, ldbt, beta, ci, ldc); break;
        case 2: row_block<2>(n, k, alpha, ai, lda, bt, ldbt, beta, ci, ldc); break;
        default: row_block<1>(n, k, alpha, ai, lda, bt, ldbt, beta, ci, ldc); break;
      }
    }
  });
}

}  // namespace scalelab::kernels::cpu
