#include "kernels/adamw.h"

#include <cmath>

#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

TEST(AdamW, MatchesTorchFormulaOverSteps) {
  Cpu c;
  const std::int64_t n = 10;
  Tensor p = c.randn({n}, 1, 1), m = c.zeros({n}), v = c.zeros({n});
  std::vector<double> rp(p.f32(), p.f32() + n), rm(n, 0), rv(n, 0);
  kernels::AdamWHyper hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  // Elements [6, 10) are "norm weights": no decay.
  const std::vector<kernels::ElementRange> ranges = {{0, 6, true}, {6, 10, false}};
  for (int step = 1; step <= 5; ++step) {
    Tensor g = c.randn({n}, 1, 100 + step);
    hp.step = step;
    kernels::adamw_update(p, m, v, g, ranges, hp, c.ctx);
    for (std::int64_t i = 0; i < n; ++i) {
      const double gi = g.f32()[i];
      if (i < 6) rp[i] *= 1 - 1e-2 * 0.1;
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.999 * rv[i] + 0.001 * gi * gi;
      const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
      rp[i] -= 1e-2 / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + 1e-8);
    }
  }
  for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(p.f32()[i], rp[i], 1e-5) << i;
}

TEST(ClipGradNorm, ScalesOnlyAboveTheMax) {
  Cpu c;
  Tensor g = c.zeros({4});
  g.f32()[0] = 3;
  g.f32()[1] = 4;  // norm 5
  EXPECT_NEAR(kernels::clip_grad_norm_(g, 10.0, c.ctx), 5.0, 1e-12);
  EXPECT_EQ(g.f32()[0], 3.0f);
  EXPECT_NEAR(kernels::clip_grad_norm_(g, 1.0, c.ctx), 5.0, 1e-12);
  EXPECT_NEAR(g.f32()[0], 3.0 / (5 + 1e-6), 1e-6);
  EXPECT_NEAR(g.f32()[1], 4.0 / (5 + 1e-6), 1e-6);
}

TEST(ClipGradNorm, SumOfSquaresIndependentOfThreads) {
  Cpu c;
  Tensor g = c.randn({300001}, 1, 5);
  omp_set_num_threads(1);
  const double a = kernels::sum_of_squares(g, c.ctx);
  omp_set_num_threads(2);
  const double b = kernels::sum_of_squares(g, c.ctx);
  EXPECT_EQ(a, b);
  EXPECT_NEAR(a, 300001.0, 3000.0);
}

}  // namespace
}  // namespace scalelab
