// kernels::gemm with one row (m = 1: a decoding step) takes the sgemv path; it must compute what
// the GEMM computes for every operand layout, leading dimension and beta.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace scalelab
