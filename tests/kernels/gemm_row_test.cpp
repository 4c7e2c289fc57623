// kernels::gemm's own paths beside OpenBLAS's sgemm must compute what the GEMM computes for every
// operand layout, leading dimension and beta: one row (m = 1: a decoding step) takes sgemv, a
// small inner dimension (k <= 32: LoRA's rank-r products) the kernel of cpu/small_k_gemm.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/small_k_gemm.h"
#include "kernels/matmul.h"

namespace scalelab {
namespace {

TEST(GemmOneRow, EqualsTheDefinitionForEveryLayout) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::int64_t n = 37, k = 53, pad = 5;
  for (bool tb : {false, true}) {
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      // B is [n, k] (tb) or [k, n], with a leading dimension wider than its rows.
      const std::int64_t rows = tb ? n : k, cols = tb ? k : n, ldb = cols + pad;
      std::vector<float> a(static_cast<std::size_t>(k)), b(static_cast<std::size_t>(rows * ldb)),
          c(static_cast<std::size_t>(n));
      for (auto& x : a) x = u(rng);
      for (auto& x : b) x = u(rng);
      for (auto& x : c) x = u(rng);
      std::vector<double> want(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t i = 0; i < k; ++i) s += static_cast<double>(a[i]) * (tb ? b[j * ldb + i] : b[i * ldb + j]);
        want[j] = 0.75 * s + beta * c[j];
      }
      kernels::gemm(false, tb, 1, n, k, 0.75f, a.data(), k, b.data(), ldb, beta, c.data(), n);
      // fp32 dot products of 53 terms of magnitude <= 1: a few ulps of ~7, far below 1e-5.
      for (std::int64_t j = 0; j < n; ++j) EXPECT_NEAR(c[j], want[j], 1e-5) << "tb " << tb << " beta " << beta << " j " << j;
    }
  }
}

// C = alpha·A·op(B) + beta·C against the definition in double, over the kernel's row tails (4, 3,
// 2, 1 rows), column tails (blocks of 16, 8, one by one), k from 1 to kSmallK and padded leading
// dimensions. Bound: a k-term fp32 sum of products has error at most k·u·Σ|a·b| (u = 2^-24), one
// more rounding for alpha and one for beta·C: (k + 2)·u·(|alpha|·Σ|a·b| + |beta·c|), doubled.
TEST(GemmSmallK, EqualsTheDefinitionForEveryLayout) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  const float alpha = 0.75f;
  for (std::int64_t k : {1, 3, 8, 24, 32}) {
    for (std::int64_t m : {16, 17, 18, 19}) {
      for (std::int64_t n : {16, 29, 40}) {
        ASSERT_TRUE(kernels::cpu::small_k_gemm_applies(false, m, n, k));
        for (bool tb : {false, true}) {
          for (float beta : {0.0f, 1.0f, 0.5f}) {
            const std::int64_t pad = 3, lda = k + pad, ldc = n + pad;
            const std::int64_t rows = tb ? n : k, cols = tb ? k : n, ldb = cols + pad;
            std::vector<float> a(static_cast<std::size_t>(m * lda)), b(static_cast<std::size_t>(rows * ldb)),
                c(static_cast<std::size_t>(m * ldc));
            for (auto& x : a) x = u(rng);
            for (auto& x : b) x = u(rng);
            for (auto& x : c) x = beta == 0.0f ? std::nanf("") : u(rng);  // beta 0: C is not read
            std::vector<float> c0 = c;
            kernels::gemm(false, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            for (std::int64_t i = 0; i < m; ++i) {
              for (std::int64_t j = 0; j < n; ++j) {
                double s = 0, mag = 0;
                for (std::int64_t q = 0; q < k; ++q) {
                  const double p = static_cast<double>(a[i * lda + q]) * (tb ? b[j * ldb + q] : b[q * ldb + j]);
                  s += p;
                  mag += std::fabs(p);
                }
                const double old = beta == 0.0f ? 0.0 : c0[i * ldc + j];
                const double want = alpha * s + beta * old;
                const double bound = 2.0 * (k + 2) * std::ldexp(1.0, -24) * (alpha * mag + std::fabs(beta * old));
                ASSERT_NEAR(c[i * ldc + j], want, bound)
                    << "k " << k << " m " << m << " n " << n << " tb " << tb << " beta " << beta << " at " << i << "," << j;
              }
              for (std::int64_t j = n; j < ldc; ++j) {  // the padding is not written
                ASSERT_TRUE(std::isnan(c[i * ldc + j]) ? std::isnan(c0[i * ldc + j]) : c[i * ldc + j] == c0[i * ldc + j]);
              }
            }
          }
        }
      }
    }
  }
}

// The same bits for an element wherever its row falls (a product over rows 5.. equals those rows
// of the whole) and at every thread count: results do not depend on how rows are split.
TEST(GemmSmallK, BitsDoNotDependOnTheRowSplitOrThreads) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::int64_t m = 203, n = 77, k = 16;
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k));
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  const int threads = num_threads();
  std::vector<float> one(static_cast<std::size_t>(m * n)), many(one.size()), part(static_cast<std::size_t>((m - 5) * n));
  set_num_threads(1);
  kernels::gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, one.data(), n);
  set_num_threads(3);
  kernels::gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, many.data(), n);
  kernels::gemm(false, true, m - 5, n, k, 1.0f, a.data() + 5 * k, k, b.data(), k, 0.0f, part.data(), n);
  set_num_threads(threads);
  EXPECT_EQ(one, many);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), one.begin() + 5 * n));
}

}  // namespace
}  // namespace scalelab
