// kernels::gemm's own paths beside OpenBLAS's sgemm must compute what the GEMM computes for every
// operand layout, leading dimension and beta: one row (m = 1: a decoding step) takes sgemv, a
// small inner dimension (k <= 32: LoRA's rank-r products) the kernel of cpu/small_k_gemm.h, one
// small output dimension over a long inner one (LoRA's reducing products) that of cpu/skinny_gemm.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/skinny_gemm.h"
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

// The skinny forms against the definition in double: no trans_a with a small n (B transposed or
// not), trans_a with a small m (dA = dzᵀ·x) and with a small n (dB = dyᵀ·z); small dimensions
// over the kernel's column blocks (4 dot products; 4 broadcast columns) and their tails, the long
// output dimension over its blocks (2 rows; 16 and 8 columns) and tails, k over the 8-lane tail,
// padded leading dimensions, beta 0 (C unread: NaN there stays out), 1 and 0.5. The bound is
// GemmSmallK's: the 8 partial sums and the tree adding them are a k-term sum in another order.
TEST(GemmSkinny, EqualsTheDefinitionForEveryForm) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-1, 1);
  const float alpha = -1.25f;
  struct Form {
    bool ta, tb;
    bool small_m;  // trans_a only: m is the small dimension
  };
  for (const Form f : {Form{false, true, false}, Form{false, false, false}, Form{true, false, true},
                       Form{true, false, false}}) {
    for (std::int64_t small : {1, 3, 8, 24, 32}) {
      for (std::int64_t big : {16, 17, 45}) {
        for (std::int64_t k : {64, 67, 131}) {
          const std::int64_t m = f.ta && f.small_m ? small : big, n = f.ta && f.small_m ? big : small;
          ASSERT_TRUE(kernels::cpu::skinny_gemm_applies(f.ta, f.tb, m, n, k)) << m << " " << n << " " << k;
          for (float beta : {0.0f, 1.0f, 0.5f}) {
            const std::int64_t pad = 3;
            // op(A) [m, k]: A is [k, m] when transposed; op(B) [k, n]: B is [n, k] when transposed.
            const std::int64_t arows = f.ta ? k : m, acols = f.ta ? m : k, lda = acols + pad;
            const std::int64_t brows = f.tb ? n : k, bcols = f.tb ? k : n, ldb = bcols + pad, ldc = n + pad;
            std::vector<float> a(static_cast<std::size_t>(arows * lda)), b(static_cast<std::size_t>(brows * ldb)),
                c(static_cast<std::size_t>(m * ldc));
            for (auto& x : a) x = u(rng);
            for (auto& x : b) x = u(rng);
            for (auto& x : c) x = beta == 0.0f ? std::nanf("") : u(rng);
            const std::vector<float> c0 = c;
            kernels::gemm(f.ta, f.tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            for (std::int64_t i = 0; i < m; ++i) {
              for (std::int64_t j = 0; j < n; ++j) {
                double s = 0, mag = 0;
                for (std::int64_t q = 0; q < k; ++q) {
                  const double p = static_cast<double>(f.ta ? a[q * lda + i] : a[i * lda + q]) *
                                   (f.tb ? b[j * ldb + q] : b[q * ldb + j]);
                  s += p;
                  mag += std::fabs(p);
                }
                const double old = beta == 0.0f ? 0.0 : c0[i * ldc + j];
                const double want = alpha * s + beta * old;
                const double bound = 2.0 * (k + 2) * std::ldexp(1.0, -24) * (std::fabs(alpha) * mag + std::fabs(beta * old));
                ASSERT_NEAR(c[i * ldc + j], want, bound) << "ta " << f.ta << " tb " << f.tb << " m " << m << " n " << n
                                                         << " k " << k << " beta " << beta << " at " << i << "," << j;
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

TEST(GemmSkinny, TakesOnlyItsShapes) {
  using kernels::cpu::skinny_gemm_applies;
  EXPECT_TRUE(skinny_gemm_applies(false, true, 1024, 24, 576));   // z = x·Aᵀ
  EXPECT_TRUE(skinny_gemm_applies(false, false, 1024, 8, 1536));  // dz = dy·B
  EXPECT_TRUE(skinny_gemm_applies(true, false, 1536, 8, 1024));   // dB = dyᵀ·z
  EXPECT_TRUE(skinny_gemm_applies(true, false, 24, 576, 1024));   // dA = dzᵀ·x
  EXPECT_FALSE(skinny_gemm_applies(false, true, 1024, 33, 576));  // no small dimension
  EXPECT_FALSE(skinny_gemm_applies(false, true, 1024, 24, 63));   // a short inner dimension
  EXPECT_FALSE(skinny_gemm_applies(false, true, 15, 24, 576));    // too few rows
  EXPECT_FALSE(skinny_gemm_applies(true, true, 24, 576, 1024));   // both transposed: OpenBLAS
  EXPECT_FALSE(skinny_gemm_applies(false, true, 8, 1024, 576));   // a small m without trans_a: OpenBLAS
}

// Every element is computed by one thread in one order: the same bits at 1 and 3 threads, and for
// a sub-range of the long dimension computed alone (another split of the rows or columns).
TEST(GemmSkinny, BitsDoNotDependOnTheSplitOrThreads) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::int64_t big = 203, small = 19, k = 301, off = 5;
  std::vector<float> x(static_cast<std::size_t>(big * k)), w(static_cast<std::size_t>(small * k)),
      g(static_cast<std::size_t>(k * big)), h(static_cast<std::size_t>(k * small));
  for (auto* v : {&x, &w, &g, &h})
    for (auto& e : *v) e = u(rng);
  const int threads = num_threads();
  // no trans_a: C [big, small] = x·wᵀ; rows from `off` alone.
  std::vector<float> one(static_cast<std::size_t>(big * small)), many(one.size()),
      part(static_cast<std::size_t>((big - off) * small));
  set_num_threads(1);
  kernels::gemm(false, true, big, small, k, 1.0f, x.data(), k, w.data(), k, 0.0f, one.data(), small);
  set_num_threads(3);
  kernels::gemm(false, true, big, small, k, 1.0f, x.data(), k, w.data(), k, 0.0f, many.data(), small);
  kernels::gemm(false, true, big - off, small, k, 1.0f, x.data() + off * k, k, w.data(), k, 0.0f, part.data(), small);
  EXPECT_EQ(one, many);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), one.begin() + off * small));
  // trans_a, small m: C [small, big] = hᵀ·g; columns from `off` alone.
  std::vector<float> t1(static_cast<std::size_t>(small * big)), t3(t1.size()), tp(static_cast<std::size_t>(small * (big - off)));
  set_num_threads(1);
  kernels::gemm(true, false, small, big, k, 1.0f, h.data(), small, g.data(), big, 0.0f, t1.data(), big);
  set_num_threads(3);
  kernels::gemm(true, false, small, big, k, 1.0f, h.data(), small, g.data(), big, 0.0f, t3.data(), big);
  kernels::gemm(true, false, small, big - off, k, 1.0f, h.data(), small, g.data() + off, big, 0.0f, tp.data(), big - off);
  EXPECT_EQ(t1, t3);
  for (std::int64_t i = 0; i < small; ++i)
    for (std::int64_t j = off; j < big; ++j) ASSERT_EQ(tp[i * (big - off) + (j - off)], t1[i * big + j]) << i << "," << j;
  // trans_a, small n: C [big, small] = gᵀ·h; rows from `off` alone.
  std::vector<float> s1(static_cast<std::size_t>(big * small)), s3(s1.size()), sp(static_cast<std::size_t>((big - off) * small));
  set_num_threads(1);
  kernels::gemm(true, false, big, small, k, 1.0f, g.data(), big, h.data(), small, 0.0f, s1.data(), small);
  set_num_threads(3);
  kernels::gemm(true, false, big, small, k, 1.0f, g.data(), big, h.data(), small, 0.0f, s3.data(), small);
  kernels::gemm(true, false, big - off, small, k, 1.0f, g.data() + off, big, h.data(), small, 0.0f, sp.data(), small);
  set_num_threads(threads);
  EXPECT_EQ(s1, s3);
  EXPECT_TRUE(std::equal(sp.begin(), sp.end(), s1.begin() + off * small));
}

}  // namespace
}  // namespace scalelab
