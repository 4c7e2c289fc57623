#include <cmath>

#include "kernels/activation.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/loss.h"
#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

TEST(VecMath, ExpIsAccurateAndVectorMatchesScalar) {
  std::vector<float> x, y(2001);
  for (int i = -1000; i <= 1000; ++i) x.push_back(i * 0.0875f);  // [-87.5, 87.5]
  vec::exp_shift_sum(x.data(), y.data(), static_cast<std::int64_t>(x.size()), 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (want < 1e-37) continue;  // below the normal range we flush
    EXPECT_NEAR(y[i], want, 3e-7 * want) << x[i];
    EXPECT_EQ(y[i], vec::exp1(x[i])) << x[i];
  }
  EXPECT_TRUE(std::isinf(vec::exp1(100.0f)));
  EXPECT_EQ(vec::exp1(-100.0f), 0.0f);
  EXPECT_NEAR(vec::exp1(88.5f), std::exp(88.5), 1e32);
}

TEST(SwiGLU, ForwardAndBackward) {
  Cpu c;
  const std::int64_t T = 5, I = 11;
  Tensor gu = c.randn({T, 2 * I}, 2, 1), h = c.zeros({T, I}), dh = c.randn({T, I}, 1, 2);
  kernels::swiglu_forward(h, gu, c.ctx);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < I; ++i) {
      const double g = gu.f32()[t * 2 * I + i], u = gu.f32()[t * 2 * I + I + i];
      EXPECT_NEAR(h.f32()[t * I + i], g / (1 + std::exp(-g)) * u, 1e-5);
    }
  auto loss = [&] {
    kernels::swiglu_forward(h, gu, c.ctx);
    return test::dot(h, dh);
  };
  Tensor dgu = c.zeros({T, 2 * I});
  kernels::swiglu_backward(dgu, dh, gu, c.ctx);
  test::expect_grad_close(gu, dgu, loss, "dgu");
}

TEST(CrossEntropy, MeanOverTargetsAndGradient) {
  Cpu c;
  const std::int64_t R = 6, V = 13;
  Tensor logits = c.randn({R, V}, 3, 1), lse = c.zeros({R});
  Tensor targets = c.ids({1, 12, kernels::kIgnoreIndex, 0, 5, 5});
  auto sum = kernels::cross_entropy_forward(lse, logits, targets, c.ctx);
  EXPECT_EQ(sum.count, 5);
  double want = 0;
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int32_t t = targets.data<std::int32_t>()[r];
    if (t < 0) continue;
    double z = 0;
    for (std::int64_t j = 0; j < V; ++j) z += std::exp(static_cast<double>(logits.f32()[r * V + j]));
    want += std::log(z) - logits.f32()[r * V + t];
  }
  EXPECT_NEAR(sum.sum, want, 1e-4);
  auto loss = [&] { return kernels::cross_entropy_forward(lse, logits, targets, c.ctx).sum / 5.0; };
  loss();
  Tensor d = c.zeros({R, V});
  kernels::cross_entropy_backward(d, logits, lse, targets, 1.0f / 5, c.ctx);
  test::expect_grad_close(logits, d, loss, "dlogits", 1e-2, 1e-3, 1e-2, 78);
  for (std::int64_t j = 0; j < V; ++j) EXPECT_EQ(d.f32()[2 * V + j], 0.0f);  // ignored row
  // In place: dlogits aliasing logits gives the same result.
  kernels::cross_entropy_forward(lse, logits, targets, c.ctx);
  kernels::cross_entropy_backward(logits, logits, lse, targets, 1.0f / 5, c.ctx);
  for (std::int64_t i = 0; i < R * V; ++i) EXPECT_FLOAT_EQ(logits.f32()[i], d.f32()[i]);
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  Cpu c;
  Tensor logits = c.randn({2, 4}, 1, 1), lse = c.zeros({2});
  Tensor targets = c.ids({1, 4});
  EXPECT_THROW(kernels::cross_entropy_forward(lse, logits, targets, c.ctx), InvalidInput);
}

}  // namespace
}  // namespace scalelab
