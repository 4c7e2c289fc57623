#include <cmath>

#include "kernels/layernorm.h"
#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

// torch.nn.LayerNorm in double: biased variance, y = (x − mean) / sqrt(var + eps) · w + b.
void reference(const Tensor& x, const Tensor& w, const Tensor& b, double eps, std::vector<double>& y,
               std::vector<double>& mean, std::vector<double>& rstd) {
  const std::int64_t H = x.dim(-1), R = x.numel() / H;
  y.assign(static_cast<std::size_t>(R * H), 0.0);
  mean.assign(static_cast<std::size_t>(R), 0.0);
  rstd.assign(static_cast<std::size_t>(R), 0.0);
  for (std::int64_t r = 0; r < R; ++r) {
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < H; ++i) m += x.f32()[r * H + i];
    m /= static_cast<double>(H);
    for (std::int64_t i = 0; i < H; ++i) v += std::pow(x.f32()[r * H + i] - m, 2);
    v /= static_cast<double>(H);
    const double inv = 1.0 / std::sqrt(v + eps);
    mean[static_cast<std::size_t>(r)] = m;
    rstd[static_cast<std::size_t>(r)] = inv;
    for (std::int64_t i = 0; i < H; ++i) {
      double o = (x.f32()[r * H + i] - m) * inv;
      if (w.defined()) o *= w.f32()[i];
      if (b.defined()) o += b.f32()[i];
      y[static_cast<std::size_t>(r * H + i)] = o;
    }
  }
}

TEST(LayerNorm, ForwardMatchesTorchDefinition) {
  Cpu c;
  const std::int64_t R = 5, H = 37;  // H not a multiple of 8: vector body and scalar tail
  Tensor x = c.randn({R, H}, 2, 1), w = c.randn({H}, 1, 2), b = c.randn({H}, 1, 3);
  for (std::int64_t i = 0; i < H; ++i) x.f32()[i] += 5.0f;  // a row with a large mean
  for (int affine = 0; affine < 2; ++affine) {
    const Tensor wa = affine ? w : Tensor(), ba = affine ? b : Tensor();
    Tensor y = c.zeros({R, H}), mean = c.zeros({R}), rstd = c.zeros({R});
    kernels::layernorm_forward(y, mean, rstd, x, wa, ba, 1e-5f, c.ctx);
    std::vector<double> ry, rm, rr;
    reference(x, wa, ba, 1e-5, ry, rm, rr);
    for (std::int64_t r = 0; r < R; ++r) {
      EXPECT_NEAR(mean.f32()[r], rm[static_cast<std::size_t>(r)], 1e-5 * (1 + std::fabs(rm[static_cast<std::size_t>(r)])));
      EXPECT_NEAR(rstd.f32()[r], rr[static_cast<std::size_t>(r)], 1e-5 * rr[static_cast<std::size_t>(r)]);
    }
    for (std::int64_t i = 0; i < R * H; ++i)
      EXPECT_NEAR(y.f32()[i], ry[static_cast<std::size_t>(i)], 1e-5 * (1 + std::fabs(ry[static_cast<std::size_t>(i)])))
          << "affine " << affine << " element " << i;
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  Cpu c;
  const std::int64_t R = 37, H = 21;  // more rows than one thread's chunk, odd width
  Tensor x = c.randn({R, H}, 1, 1), w = c.randn({H}, 1, 2), b = c.randn({H}, 1, 3), dy = c.randn({R, H}, 1, 4);
  Tensor y = c.zeros({R, H}), mean = c.zeros({R}), rstd = c.zeros({R});
  auto loss = [&] {
    kernels::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f, c.ctx);
    return test::dot(y, dy);
  };
  loss();
  Tensor dx = c.zeros({R, H}), dw = c.randn({H}, 1, 5), db = c.randn({H}, 1, 6);
  Tensor dw0 = c.zeros({H}), db0 = c.zeros({H});
  dw0.copy_from(dw);
  db0.copy_from(db);
  kernels::layernorm_backward(dx, &dw, &db, dy, x, mean, rstd, w, c.ctx);
  // Parameter gradients accumulate: subtract what was there.
  for (std::int64_t i = 0; i < H; ++i) {
    dw.f32()[i] -= dw0.f32()[i];
    db.f32()[i] -= db0.f32()[i];
  }
  test::expect_grad_close(x, dx, loss, "dx");
  test::expect_grad_close(w, dw, loss, "dw");
  test::expect_grad_close(b, db, loss, "db");
}

TEST(LayerNorm, BackwardWithoutAffineAndAccumulating) {
  Cpu c;
  const std::int64_t R = 6, H = 19;
  Tensor x = c.randn({R, H}, 1, 1), dy = c.randn({R, H}, 1, 2);
  Tensor y = c.zeros({R, H}), mean = c.zeros({R}), rstd = c.zeros({R});
  auto loss = [&] {
    kernels::layernorm_forward(y, mean, rstd, x, Tensor(), Tensor(), 1e-5f, c.ctx);
    return test::dot(y, dy);
  };
  loss();
  Tensor dx = c.zeros({R, H});
  kernels::layernorm_backward(dx, nullptr, nullptr, dy, x, mean, rstd, Tensor(), c.ctx);
  test::expect_grad_close(x, dx, loss, "dx (no affine)");
  // Each row's gradient of a normalized output sums to zero (shift invariance).
  for (std::int64_t r = 0; r < R; ++r) {
    double s = 0;
    for (std::int64_t i = 0; i < H; ++i) s += dx.f32()[r * H + i];
    EXPECT_NEAR(s, 0.0, 1e-5);
  }
  loss();  // the finite differences left mean/rstd of a perturbed x
  Tensor acc = c.randn({R, H}, 1, 3), before = c.zeros({R, H});
  before.copy_from(acc);
  kernels::layernorm_backward(acc, nullptr, nullptr, dy, x, mean, rstd, Tensor(), c.ctx, /*accumulate_dx=*/true);
  for (std::int64_t i = 0; i < R * H; ++i) EXPECT_NEAR(acc.f32()[i], before.f32()[i] + dx.f32()[i], 1e-6);
}

}  // namespace
}  // namespace scalelab
