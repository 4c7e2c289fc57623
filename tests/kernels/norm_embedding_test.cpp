#include <cmath>

#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

TEST(RMSNorm, ForwardMatchesDefinition) {
  Cpu c;
  const std::int64_t R = 4, H = 16;
  Tensor x = c.randn({R, H}, 2, 1), w = c.randn({H}, 1, 2), y = c.zeros({R, H}), rstd = c.zeros({R});
  kernels::rmsnorm_forward(y, rstd, x, w, 1e-5f, c.ctx);
  for (std::int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (std::int64_t i = 0; i < H; ++i) ss += std::pow(x.f32()[r * H + i], 2);
    const double inv = 1.0 / std::sqrt(ss / H + 1e-5);
    EXPECT_NEAR(rstd.f32()[r], inv, 1e-5 * inv);
    for (std::int64_t i = 0; i < H; ++i) EXPECT_NEAR(y.f32()[r * H + i], w.f32()[i] * x.f32()[r * H + i] * inv, 1e-5);
  }
}

TEST(RMSNorm, BackwardMatchesFiniteDifferences) {
  Cpu c;
  const std::int64_t R = 37, H = 24;  // more rows than one thread's chunk
  Tensor x = c.randn({R, H}, 1, 1), w = c.randn({H}, 1, 2), dy = c.randn({R, H}, 1, 3);
  Tensor y = c.zeros({R, H}), rstd = c.zeros({R});
  auto loss = [&] {
    kernels::rmsnorm_forward(y, rstd, x, w, 1e-5f, c.ctx);
    return test::dot(y, dy);
  };
  loss();
  Tensor dx = c.zeros({R, H}), dw = c.zeros({H});
  kernels::rmsnorm_backward(dx, dw, dy, x, rstd, w, c.ctx);
  test::expect_grad_close(x, dx, loss, "dx");
  test::expect_grad_close(w, dw, loss, "dw");
}

TEST(Embedding, ForwardGathersAndBackwardScatters) {
  Cpu c;
  const std::int64_t V = 10, H = 6;
  Tensor table = c.randn({V, H}, 1, 1);
  Tensor ids = c.ids({3, 0, 3, 9});
  Tensor y = c.zeros({4, H}), dy = c.randn({4, H}, 1, 2), dtable = c.zeros({V, H});
  kernels::embedding_forward(y, ids, table, c.ctx);
  for (std::int64_t i = 0; i < H; ++i) EXPECT_EQ(y.f32()[2 * H + i], table.f32()[3 * H + i]);
  auto loss = [&] {
    kernels::embedding_forward(y, ids, table, c.ctx);
    return test::dot(y, dy);
  };
  kernels::embedding_backward(dtable, dy, ids, c.ctx);
  test::expect_grad_close(table, dtable, loss, "dtable", 1e-2, 1e-3, 1e-2, 60);
  // Repeated id 3 gets both rows' gradients.
  EXPECT_NEAR(dtable.f32()[3 * H], dy.f32()[0] + dy.f32()[2 * H], 1e-6);
}

TEST(Embedding, RejectsIdsOutsideTheTable) {
  Cpu c;
  Tensor table = c.randn({10, 4}, 1, 1), y = c.zeros({2, 4});
  Tensor ids = c.ids({1, 10});
  try {
    kernels::embedding_forward(y, ids, table, c.ctx);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("token id 10"), std::string::npos);
  }
}

}  // namespace
}  // namespace scalelab
