// Flash attention against the eager kernel (the oracle), a double-precision log-sum-exp, and finite
// differences; plus its memory behaviour (no S×S buffer, exact workspace) and determinism.
//
// Tolerances (fp32 in, fp32 out): the flash kernels compute the same sums as eager in a different
// order (online softmax, tile by tile), so outputs agree to a few fp32 ulps of values of order 1:
// 1e-5 absolute (+1e-5 relative for gradients, which grow with S).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "test_util.h"

namespace scalelab {
namespace {

using kernels::AttentionShape;
using test::Cpu;

float scale_of(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

// log Σ_{j<=i} exp(scale · q_i · k_j) in double, [B, nh, S].
std::vector<double> reference_lse(const Tensor& qkv, const AttentionShape& s, double scale) {
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), group = s.n_heads / s.n_kv_heads;
  const float* p = qkv.f32();
  std::vector<double> lse(static_cast<std::size_t>(s.batch * s.n_heads * S));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.n_heads; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(static_cast<std::size_t>(i + 1));
        double m = -1e300;
        for (std::int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (std::int64_t k = 0; k < hd; ++k)
            d += static_cast<double>(p[(b * S + i) * ld + h * hd + k]) *
                 p[(b * S + j) * ld + (s.n_heads + h / group) * hd + k];
          sc[static_cast<std::size_t>(j)] = d * scale;
          m = std::max(m, d * scale);
        }
        double z = 0;
        for (double v : sc) z += std::exp(v - m);
        lse[static_cast<std::size_t>((b * s.n_heads + h) * S + i)] = m + std::log(z);
      }
  return lse;
}

struct FlashRun {
  Tensor out, lse, dqkv;
};

FlashRun run_flash(Cpu& c, const Tensor& qkv, const Tensor& dout, const AttentionShape& s) {
  FlashRun r;
  r.out = c.randn({s.batch * s.seq, s.out_width()}, 1, 90);  // garbage: must be overwritten
  r.lse = c.randn({s.batch, s.n_heads, s.seq}, 1, 91);
  r.dqkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 92);
  kernels::attention_flash_forward(r.out, r.lse, qkv, s, scale_of(s), c.ctx);
  kernels::attention_flash_backward(r.dqkv, dout, r.out, r.lse, qkv, s, scale_of(s), c.ctx);
  return r;
}

class AttentionFlashTest : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(AttentionFlashTest, ForwardMatchesEagerAndLseMatchesReference) {
  Cpu c;
  const auto s = GetParam();
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 11);
  Tensor dout = c.randn({s.batch * s.seq, s.out_width()}, 1, 12);
  const FlashRun f = run_flash(c, qkv, dout, s);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), probs = c.zeros({s.batch, s.n_heads, s.seq, s.seq});
  kernels::attention_eager_forward(out, probs, qkv, s, scale_of(s), c.ctx);
  double max_diff = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(out.f32()[i] - f.out.f32()[i])));
  EXPECT_LE(max_diff, 1e-5);
  const auto lse = reference_lse(qkv, s, scale_of(s));
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(f.lse.f32()[i], lse[i], 2e-5) << "lse " << i;
}

TEST_P(AttentionFlashTest, BackwardMatchesEager) {
  Cpu c;
  const auto s = GetParam();
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 21);
  Tensor dout = c.randn({s.batch * s.seq, s.out_width()}, 1, 22);
  const FlashRun f = run_flash(c, qkv, dout, s);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), probs = c.zeros({s.batch, s.n_heads, s.seq, s.seq});
  Tensor dqkv = c.zeros({s.batch * s.seq, s.qkv_width()});
  kernels::attention_eager_forward(out, probs, qkv, s, scale_of(s), c.ctx);
  kernels::attention_eager_backward(dqkv, dout, probs, qkv, s, scale_of(s), c.ctx);
  for (std::int64_t i = 0; i < dqkv.numel(); ++i) {
    const float e = dqkv.f32()[i];
    ASSERT_NEAR(f.dqkv.f32()[i], e, 1e-5 + 1e-5 * std::fabs(e)) << "dqkv element " << i << " (row "
                                                               << i / s.qkv_width() << ", column "
                                                               << i % s.qkv_width() << ")";
  }
}

TEST_P(AttentionFlashTest, BackwardMatchesFiniteDifferences) {
  Cpu c;
  const auto s = GetParam();
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 31);
  Tensor dout = c.randn({s.batch * s.seq, s.out_width()}, 1, 32);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), lse = c.zeros({s.batch, s.n_heads, s.seq});
  auto loss = [&] {
    kernels::attention_flash_forward(out, lse, qkv, s, scale_of(s), c.ctx);
    return test::dot(out, dout);
  };
  loss();
  Tensor dqkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 33);  // garbage: must be overwritten
  kernels::attention_flash_backward(dqkv, dout, out, lse, qkv, s, scale_of(s), c.ctx);
  test::expect_grad_close(qkv, dqkv, loss, "dqkv", 1e-2, 2e-3, 2e-2, 60);
}

TEST_P(AttentionFlashTest, TwoRunsAreBitIdenticalWithTwoThreads) {
  Cpu c;
  const auto s = GetParam();
  const int before = num_threads();
  set_num_threads(2);
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 41);
  Tensor dout = c.randn({s.batch * s.seq, s.out_width()}, 1, 42);
  const FlashRun a = run_flash(c, qkv, dout, s);
  const FlashRun b = run_flash(c, qkv, dout, s);
  set_num_threads(before);
  EXPECT_EQ(std::memcmp(a.out.raw(), b.out.raw(), a.out.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.lse.raw(), b.lse.raw(), a.lse.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.dqkv.raw(), b.dqkv.raw(), a.dqkv.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionFlashTest,
                         ::testing::Values(AttentionShape{2, 5, 4, 2, 4},      // GQA, S smaller than a tile, B>1
                                           AttentionShape{1, 70, 2, 1, 8},     // crosses a row tile (64)
                                           AttentionShape{2, 9, 3, 3, 6},      // MHA, B>1
                                           AttentionShape{1, 1, 2, 1, 4},      // a single token
                                           AttentionShape{1, 300, 4, 2, 16},   // crosses a column tile (256)
                                           AttentionShape{2, 130, 4, 1, 8},    // group of 4, B>1, ragged tiles
                                           AttentionShape{1, 100, 6, 2, 10}),  // group of 3 (42-position tiles)
                         [](const ::testing::TestParamInfo<AttentionShape>& i) {
                           const AttentionShape& s = i.param;
                           return "B" + std::to_string(s.batch) + "_S" + std::to_string(s.seq) + "_nh" +
                                  std::to_string(s.n_heads) + "_kv" + std::to_string(s.n_kv_heads) + "_hd" +
                                  std::to_string(s.head_dim);
                         });

// For a long sequence the flash kernels allocate one small scratch block each (exactly what
// attention_flash_workspace_bytes says), far below one S×S buffer.
TEST(AttentionFlashMemory, NoSquareBufferAndExactWorkspace) {
  Cpu c;
  const AttentionShape s{1, 1024, 2, 1, 8};
  const std::size_t square = static_cast<std::size_t>(s.seq * s.seq) * sizeof(float);
  for (int threads : {1, 2}) {
    const int before_threads = num_threads();
    set_num_threads(threads);
    Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 51);
    Tensor dout = c.randn({s.batch * s.seq, s.out_width()}, 1, 52);
    Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), lse = c.zeros({s.batch, s.n_heads, s.seq});
    Tensor dqkv = c.zeros({s.batch * s.seq, s.qkv_width()});
    c.alloc->reset_peaks();
    const MemoryStats base = c.alloc->stats();
    kernels::attention_flash_forward(out, lse, qkv, s, scale_of(s), c.ctx);
    const MemoryStats fwd = c.alloc->stats();
    c.alloc->reset_peaks();
    kernels::attention_flash_backward(dqkv, dout, out, lse, qkv, s, scale_of(s), c.ctx);
    const MemoryStats bwd = c.alloc->stats();
    set_num_threads(before_threads);

    EXPECT_EQ(fwd.allocated, base.allocated) << "the forward must free its scratch";
    EXPECT_EQ(bwd.allocated, base.allocated) << "the backward must free its scratch";
    EXPECT_EQ(fwd.num_allocations - base.num_allocations, 1u);
    EXPECT_EQ(bwd.num_allocations - fwd.num_allocations, 1u);
    const std::size_t fwd_extra = fwd.peak_allocated - base.allocated;
    const std::size_t bwd_extra = bwd.peak_allocated - base.allocated;
    EXPECT_LT(fwd_extra, square) << threads << " threads";
    EXPECT_LT(bwd_extra, square) << threads << " threads";
    EXPECT_EQ(fwd_extra, DeviceAllocator::round_size(kernels::attention_flash_workspace_bytes(s, threads, Phase::kForward)));
    EXPECT_EQ(bwd_extra,
              DeviceAllocator::round_size(kernels::attention_flash_workspace_bytes(s, threads, Phase::kBackward)));
  }
}

TEST(AttentionFlashMemory, WorkspaceFormula) {
  // llama-small at S = 1024: G = 4, Br = 32, Bc = 256, M = 128, hd = 64.
  // Forward 128·256 + 2·128·64 + 2·128 = 49408 floats per thread; backward 2·128·256 + 3·128·64 + 2·128 = 90368.
  const AttentionShape big{4, 1024, 8, 2, 64};
  EXPECT_EQ(kernels::attention_flash_workspace_bytes(big, 2, Phase::kForward), 2u * 49408u * 4u);
  EXPECT_EQ(kernels::attention_flash_workspace_bytes(big, 2, Phase::kBackward), 2u * 90368u * 4u);
  // S = 5: tiles clamp to 5 positions × 5 keys, G = 2, M = 10, hd = 4.
  // Forward 50 + 80 + 20 = 150 -> 160 floats (padded); backward 100 + 120 + 20 = 240 floats.
  const AttentionShape tiny{1, 5, 2, 1, 4};
  EXPECT_EQ(kernels::attention_flash_workspace_bytes(tiny, 3, Phase::kForward), 3u * 160u * 4u);
  EXPECT_EQ(kernels::attention_flash_workspace_bytes(tiny, 3, Phase::kBackward), 3u * 240u * 4u);
  // G = 3 does not divide 128: Br = 42, M = 126, Bc = S = 100, hd = 10.
  // Forward 12600 + 2520 + 252 = 15372 -> 15376 floats; backward 25200 + 3780 + 252 = 29232 floats.
  const AttentionShape odd{1, 100, 6, 2, 10};
  EXPECT_EQ(kernels::attention_flash_workspace_bytes(odd, 1, Phase::kForward), 15376u * 4u);
  EXPECT_EQ(kernels::attention_flash_workspace_bytes(odd, 1, Phase::kBackward), 29232u * 4u);
  EXPECT_THROW(kernels::attention_flash_workspace_bytes(tiny, 1, Phase::kOptimizer), RuntimeError);
}

TEST(AttentionFlashErrors, RejectsWrongShapes) {
  Cpu c;
  const AttentionShape s{1, 8, 2, 1, 4};
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 61);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()});
  Tensor bad_lse = c.zeros({s.batch, s.n_heads, s.seq + 1});
  EXPECT_THROW(kernels::attention_flash_forward(out, bad_lse, qkv, s, 0.5f, c.ctx), RuntimeError);
  const AttentionShape bad_groups{1, 8, 3, 2, 4};
  Tensor lse = c.zeros({1, 3, 8});
  EXPECT_THROW(kernels::attention_flash_forward(out, lse, qkv, bad_groups, 0.5f, c.ctx), RuntimeError);
}

}  // namespace
}  // namespace scalelab
