// LoRA dropout (--lora-dropout P; model/decoder/lora.h): y += s·B·A·dropout(x) with inverted
// dropout and masks from the counter-based generator (kernels/dropout.h), which cannot equal
// torch's masks — so these tests check the math: the forward against the formula with the
// generator's keep bits, the mask statistics, that evaluation (train_step < 0) and P = 0 compute
// exactly what no dropout computes, and that with the mask fixed (the same key) the gradients
// pass finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/dropout.h"
#include "kernels/test_util.h"
#include "model/decoder/lora.h"

namespace scalelab {
namespace {

constexpr std::int64_t T = 48, In = 32, R = 4, Out = 24;
constexpr float kScale = 2.0f;

struct Rig {
  test::Cpu c;
  Tensor x = c.randn({T, In}, 1.0f, 1);
  Tensor a = c.randn({R, In}, 0.3f, 2), b = c.randn({Out, R}, 0.3f, 3);
  Tensor da = c.zeros({R, In}), db = c.zeros({Out, R});
  LoraAdapter adapter(float p) {
    LoraAdapter::Part part{a, da, b, db, 0, lora_dropout_site("q_proj")};
    return LoraAdapter({part}, Out, kScale, p, /*layer=*/1);
  }
  Tensor forward(LoraAdapter& l) {
    Tensor y = c.zeros({T, Out});
    l.forward(y, x, c.ctx);
    return y;
  }
};

bool same_bits(const Tensor& u, const Tensor& v) {
  return u.numel() == v.numel() && std::memcmp(u.raw(), v.raw(), static_cast<std::size_t>(u.numel()) * 4) == 0;
}

TEST(LoraDropout, ForwardIsTheFormulaWithTheGeneratorsMask) {
  Rig s;
  const float p = 0.3f;
  s.c.ctx.train_step = 5;
  s.c.ctx.train_seed = 77;
  LoraAdapter l = s.adapter(p);
  const Tensor y = s.forward(l);
  const kernels::DropoutKey key{77, 5, 1, lora_dropout_site("q_proj")};
  std::int64_t kept = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    double z[R] = {};
    for (std::int64_t k = 0; k < In; ++k) {
      const bool keep = kernels::dropout_keep(p, key, t * In + k);
      kept += keep;
      const double xd = keep ? s.x.f32()[t * In + k] / (1.0 - p) : 0.0;
      for (std::int64_t r = 0; r < R; ++r) z[r] += xd * s.a.f32()[r * In + k];
    }
    for (std::int64_t o = 0; o < Out; ++o) {
      double v = 0;
      for (std::int64_t r = 0; r < R; ++r) v += z[r] * s.b.f32()[o * R + r];
      ASSERT_NEAR(y.f32()[t * Out + o], kScale * v, 1e-5 * (1 + std::abs(kScale * v))) << t << "," << o;
    }
  }
  // The kept fraction: binomial(n, 1 − p) — within 5 standard deviations of 1 − p.
  const double n = T * In, frac = static_cast<double>(kept) / n, sd = std::sqrt(p * (1 - p) / n);
  EXPECT_NEAR(frac, 1 - p, 5 * sd);
  // Another micro-step draws another mask.
  s.c.ctx.train_step = 6;
  EXPECT_FALSE(same_bits(s.forward(l), y));
}

TEST(LoraDropout, MaskStatisticsOverManyElements) {
  for (const float p : {0.05f, 0.1f, 0.5f}) {
    const kernels::DropoutKey key{42, 3, 7, lora_dropout_site("v_proj")};
    const std::int64_t n = 1 << 18;
    std::int64_t kept = 0, runs = 0;
    bool prev = true;
    for (std::int64_t i = 0; i < n; ++i) {
      const bool k = kernels::dropout_keep(p, key, i);
      kept += k;
      runs += (i > 0 && k != prev);
      prev = k;
    }
    const double frac = static_cast<double>(kept) / n, sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(frac, 1 - p, 5 * sd) << p;
    // independent neighbours: a change between consecutive elements with probability 2p(1 − p)
    const double q = 2.0 * p * (1 - p), sdq = std::sqrt(q * (1 - q) / n);
    EXPECT_NEAR(static_cast<double>(runs) / (n - 1), q, 5 * sdq) << p;
  }
}

TEST(LoraDropout, EvaluationAndZeroProbabilityAreExactlyNoDropout) {
  Rig s;
  LoraAdapter plain = s.adapter(0.0f);
  const Tensor ref = s.forward(plain);  // train_step −1: no training
  LoraAdapter l = s.adapter(0.25f);
  EXPECT_TRUE(same_bits(s.forward(l), ref)) << "evaluation (train_step < 0) must not drop";
  s.c.ctx.train_step = 3;
  EXPECT_TRUE(same_bits(s.forward(plain), ref)) << "P = 0 in training must be bit-identical";
  EXPECT_FALSE(same_bits(s.forward(l), ref));
  // backward with P = 0 in training equals backward outside training, bit for bit
  Tensor dy = s.c.randn({T, Out}, 1.0f, 9);
  Tensor dx1 = s.c.zeros({T, In}), dx2 = s.c.zeros({T, In});
  plain.backward(&dx1, dy, s.x, s.c.ctx);
  const Tensor da1 = test::clone(s.c, s.da);
  s.da.zero_();
  s.db.zero_();
  s.c.ctx.train_step = -1;
  plain.backward(&dx2, dy, s.x, s.c.ctx);
  EXPECT_TRUE(same_bits(dx1, dx2));
  EXPECT_TRUE(same_bits(da1, s.da));
}

TEST(LoraDropout, GradientsPassFiniteDifferencesWithTheMaskFixed) {
  Rig s;
  s.c.ctx.train_step = 11;
  s.c.ctx.train_seed = 5;
  LoraAdapter l = s.adapter(0.4f);
  Tensor g = s.c.randn({T, Out}, 1.0f, 21);  // L = Σ y ⊙ g
  auto loss = [&] {
    const Tensor y = s.forward(l);
    return test::dot(y, g);
  };
  Tensor dx = s.c.zeros({T, In});
  l.backward(&dx, g, s.x, s.c.ctx);
  // L is linear in x, A and B separately: central differences are exact up to rounding.
  test::expect_grad_close(s.x, dx, loss, "dx", 1e-2, 1e-3, 1e-3);
  test::expect_grad_close(s.a, s.da, loss, "dA", 1e-2, 1e-3, 1e-3);
  test::expect_grad_close(s.b, s.db, loss, "dB", 1e-2, 1e-3, 1e-3);
  // dropped inputs get no gradient through the adapter
  const kernels::DropoutKey key{5, 11, 1, lora_dropout_site("q_proj")};
  int dropped = 0;
  for (std::int64_t i = 0; i < T * In; ++i) {
    if (!kernels::dropout_keep(0.4f, key, i)) {
      ++dropped;
      ASSERT_EQ(dx.f32()[i], 0.0f) << i;
    }
  }
  EXPECT_GT(dropped, 0);
}

}  // namespace
}  // namespace scalelab
