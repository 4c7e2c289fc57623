#include "kernels/rope.h"

#include <cmath>

#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

TEST(Rope, InvFreqFollowsTheta) {
  auto f = kernels::rope_inv_freq(8, 10000.0, std::nullopt);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[1], 1.0 / std::pow(10000.0, 0.25), 1e-7);
  EXPECT_NEAR(f[3], 1.0 / std::pow(10000.0, 0.75), 1e-9);
}

TEST(Rope, Llama3ScalingKeepsHighAndScalesLowFrequencies) {
  RopeScaling s{"llama3", 8.0, 1.0, 4.0, 64};
  auto base = kernels::rope_inv_freq(32, 10000.0, std::nullopt);
  auto scaled = kernels::rope_inv_freq(32, 10000.0, s);
  int kept = 0, divided = 0, smoothed = 0;
  for (std::size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2 * M_PI / base[i];
    if (wavelen < 64.0 / 4.0) {
      EXPECT_EQ(scaled[i], base[i]);
      ++kept;
    } else if (wavelen > 64.0) {
      EXPECT_NEAR(scaled[i], base[i] / 8.0, 1e-9);
      ++divided;
    } else {
      const double smooth = (64.0 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(scaled[i], (1 - smooth) * base[i] / 8 + smooth * base[i], 1e-6 * base[i]);
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(Rope, RotatesHalvesAndBackwardIsTheAdjoint) {
  Cpu c;
  const std::int64_t S = 5, heads = 2, hd = 8, ld = 24, col = 4;  // heads start at column 4
  auto table = kernels::make_rope_table(hd, 16, 10000.0, std::nullopt);
  Tensor x = c.randn({2 * S, ld}, 1, 1), orig = c.zeros({2 * S, ld});
  orig.copy_from(x);
  kernels::rope_forward(x, col, ld, heads, hd, S, table, c.ctx);
  // Row 7 is position 2 of the second sequence; check head 1, pair 1 by hand.
  const std::int64_t r = 7, pos = 2, i = 1, base = r * ld + col + hd;
  const double ang = pos * table.inv_freq[i];
  const double x1 = orig.f32()[base + i], x2 = orig.f32()[base + i + hd / 2];
  EXPECT_NEAR(x.f32()[base + i], x1 * std::cos(ang) - x2 * std::sin(ang), 1e-5);
  EXPECT_NEAR(x.f32()[base + i + hd / 2], x2 * std::cos(ang) + x1 * std::sin(ang), 1e-5);
  // Columns outside the heads are untouched.
  EXPECT_EQ(x.f32()[r * ld + 0], orig.f32()[r * ld + 0]);
  EXPECT_EQ(x.f32()[r * ld + 23], orig.f32()[r * ld + 23]);
  // Backward against finite differences of L = <rope(x), w>.
  Tensor w = c.randn({2 * S, ld}, 1, 2), y = c.zeros({2 * S, ld});
  Tensor xin = c.randn({2 * S, ld}, 1, 3);
  auto loss = [&] {
    y.copy_from(xin);
    kernels::rope_forward(y, col, ld, heads, hd, S, table, c.ctx);
    return test::dot(y, w);
  };
  Tensor g = c.zeros({2 * S, ld});
  g.copy_from(w);
  kernels::rope_backward(g, col, ld, heads, hd, S, table, c.ctx);
  test::expect_grad_close(xin, g, loss, "dx");
}

}  // namespace
}  // namespace scalelab
