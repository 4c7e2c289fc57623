#include "kernels/matmul.h"

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
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

namespace scalelab {
namespace {

// gemm_ex_group: independent products, run concurrently on the CPU (each on one thread). Every
// output equals gemm_ex of that product alone on one thread, bit for bit, at any thread count —
// including accumulation (beta 1), transposed operands, sub-matrices (leading dimensions) and
// products of different sizes; a group with a bf16 operand runs one by one and equals gemm_ex.
TEST(GemmExGroup, EqualsEachProductAloneBitForBit) {
  test::Cpu c;
  const std::int64_t T = 96, In = 40, R = 12, N = 56;
  Tensor x = c.randn({T, In}, 1.0f, 1), a = c.randn({R, In}, 0.5f, 2), dy = c.randn({T, N}, 1.0f, 3);
  Tensor b = c.randn({N, 4}, 0.5f, 4), z = c.randn({T, R}, 1.0f, 5);
  auto outputs = [&] {
    return std::vector<Tensor>{c.randn({T, R}, 1.0f, 6), c.randn({N, 4}, 1.0f, 7), c.randn({T, 4}, 1.0f, 8),
                               c.randn({R, In}, 1.0f, 9), c.randn({T, In}, 1.0f, 10)};
  };
  auto products = [&](std::vector<Tensor>& o) {
    using kernels::GemmExArgs;
    const DType f = DType::kF32;
    return std::vector<GemmExArgs>{
        {false, true, T, R, In, 1.0f, x.raw(), f, In, a.raw(), f, In, 0.0f, o[0].raw(), f, R},       // z = x·Aᵀ
        {true, false, N, 4, T, 0.5f, dy.raw(), f, N, z.raw(), f, R, 1.0f, o[1].raw(), f, 4},         // dB += dyᵀ·z[:, :4]
        {false, false, T, 4, N, 0.5f, dy.raw(), f, N, b.raw(), f, 4, 0.0f, o[2].raw(), f, 4},        // dz = dy·B
        {true, false, R, In, T, 1.0f, z.raw(), f, R, x.raw(), f, In, 1.0f, o[3].raw(), f, In},       // dA += zᵀ·x
        {false, false, T, In, R, 1.0f, z.raw(), f, R, a.raw(), f, In, 1.0f, o[4].raw(), f, In}};     // dx += z·A
  };
  const int threads = num_threads();
  set_num_threads(1);
  std::vector<Tensor> ref = outputs();
  for (const auto& g : products(ref))
    kernels::gemm_ex(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a, g.a_type, g.lda, g.b, g.b_type, g.ldb,
                     g.beta, g.c, g.c_type, g.ldc, c.ctx);
  for (int nt : {1, 2, 3}) {
    set_num_threads(nt);
    std::vector<Tensor> got = outputs();
    kernels::gemm_ex_group(products(got), c.ctx);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_EQ(std::memcmp(got[i].raw(), ref[i].raw(), static_cast<std::size_t>(ref[i].numel()) * sizeof(float)), 0)
          << "product " << i << " at " << nt << " threads";
    }
  }
  // A bf16 operand: one by one, the same as gemm_ex.
  set_num_threads(2);
  Tensor xb = Tensor::empty({T, In}, DType::kBF16, *c.alloc);
  convert(x.raw(), DType::kF32, xb.raw(), DType::kBF16, static_cast<std::size_t>(T * In));
  Tensor z1 = c.zeros({T, R}), z2 = c.zeros({T, R});
  kernels::gemm_ex(false, true, T, R, In, 1.0f, xb.raw(), DType::kBF16, In, a.raw(), DType::kF32, In, 0.0f, z1.raw(),
                   DType::kF32, R, c.ctx);
  kernels::gemm_ex_group({{false, true, T, R, In, 1.0f, xb.raw(), DType::kBF16, In, a.raw(), DType::kF32, In, 0.0f,
                           z2.raw(), DType::kF32, R}},
                         c.ctx);
  EXPECT_EQ(std::memcmp(z1.raw(), z2.raw(), static_cast<std::size_t>(T * R) * sizeof(float)), 0);
  set_num_threads(threads);
}

}  // namespace
}  // namespace scalelab
