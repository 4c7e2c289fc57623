#include "kernels/matmul.h"

#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

TEST(Linear, ForwardMatchesNaive) {
  Cpu c;
  const std::int64_t T = 5, in = 7, out = 3;
  Tensor x = c.randn({T, in}, 1, 1), w = c.randn({out, in}, 1, 2), b = c.randn({out}, 1, 3), y = c.zeros({T, out});
  kernels::linear_forward(y, x, w, &b, c.ctx);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b.f32()[o];
      for (std::int64_t i = 0; i < in; ++i) s += static_cast<double>(x.f32()[t * in + i]) * w.f32()[o * in + i];
      EXPECT_NEAR(y.f32()[t * out + o], s, 1e-5);
    }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  Cpu c;
  const std::int64_t T = 6, in = 5, out = 4;
  Tensor x = c.randn({T, in}, 1, 1), w = c.randn({out, in}, 1, 2), b = c.randn({out}, 1, 3);
  Tensor dy = c.randn({T, out}, 1, 4), y = c.zeros({T, out});
  auto loss = [&] {
    kernels::linear_forward(y, x, w, &b, c.ctx);
    return test::dot(y, dy);
  };
  Tensor dx = c.zeros({T, in}), dw = c.randn({out, in}, 1, 9), db = c.randn({out}, 1, 10);
  Tensor dw0 = c.zeros({out, in}), db0 = c.zeros({out});
  dw0.copy_from(dw);
  db0.copy_from(db);
  kernels::linear_backward(&dx, dw, &db, dy, x, w, c.ctx);
  // Parameter gradients accumulate: subtract what was there before.
  for (std::int64_t i = 0; i < dw.numel(); ++i) dw.f32()[i] -= dw0.f32()[i];
  for (std::int64_t i = 0; i < db.numel(); ++i) db.f32()[i] -= db0.f32()[i];
  test::expect_grad_close(x, dx, loss, "dx");
  test::expect_grad_close(w, dw, loss, "dw");
  test::expect_grad_close(b, db, loss, "dbias");
}

TEST(Linear, AccumulateDxAddsAndRejectsBadShapes) {
  Cpu c;
  Tensor x = c.randn({3, 4}, 1, 1), w = c.randn({2, 4}, 1, 2), dy = c.randn({3, 2}, 1, 3);
  Tensor dx1 = c.zeros({3, 4}), dx2 = c.randn({3, 4}, 1, 5), dx2_orig = c.zeros({3, 4}), dw = c.zeros({2, 4});
  dx2_orig.copy_from(dx2);
  kernels::linear_backward(&dx1, dw, nullptr, dy, x, w, c.ctx);
  kernels::linear_backward(&dx2, dw, nullptr, dy, x, w, c.ctx, /*accumulate_dx=*/true);
  for (std::int64_t i = 0; i < 12; ++i) EXPECT_NEAR(dx2.f32()[i], dx2_orig.f32()[i] + dx1.f32()[i], 1e-6);
  Tensor bad = c.zeros({3, 3});
  EXPECT_THROW(kernels::linear_forward(bad, x, w, nullptr, c.ctx), Error);
}

}  // namespace
}  // namespace scalelab
