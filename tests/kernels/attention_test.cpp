#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

// Naive double-precision causal GQA attention over packed qkv.
std::vector<double> reference(const Tensor& qkv, const kernels::AttentionShape& s, double scale) {
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), group = s.n_heads / s.n_kv_heads;
  std::vector<double> out(static_cast<std::size_t>(s.batch * S * s.out_width()));
  const float* p = qkv.f32();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.n_heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(static_cast<std::size_t>(i + 1));
        double m = -1e300;
        for (std::int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (std::int64_t k = 0; k < hd; ++k)
            d += static_cast<double>(p[(b * S + i) * ld + h * hd + k]) * p[(b * S + j) * ld + s.n_heads * hd + g * hd + k];
          sc[static_cast<std::size_t>(j)] = d * scale;
          m = std::max(m, d * scale);
        }
        double z = 0;
        for (auto& v : sc) z += (v = std::exp(v - m));
        for (std::int64_t k = 0; k < hd; ++k) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j)
            o += sc[static_cast<std::size_t>(j)] / z *
                 p[(b * S + j) * ld + (s.n_heads + s.n_kv_heads) * hd + g * hd + k];
          out[static_cast<std::size_t>((b * S + i) * s.out_width() + h * hd + k)] = o;
        }
      }
    }
  return out;
}

class AttentionTest : public ::testing::TestWithParam<kernels::AttentionShape> {};

TEST_P(AttentionTest, ForwardMatchesReference) {
  Cpu c;
  const auto s = GetParam();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 1);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), probs = c.zeros({s.batch, s.n_heads, s.seq, s.seq});
  kernels::attention_eager_forward(out, probs, qkv, s, scale, c.ctx);
  const auto ref = reference(qkv, s, scale);
  for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out.f32()[i], ref[i], 2e-5) << i;
  // Probabilities: causal (zero above the diagonal) and rows sum to 1.
  for (std::int64_t r = 0; r < s.seq; ++r) {
    double sum = 0;
    for (std::int64_t j = 0; j < s.seq; ++j) {
      const float v = probs.f32()[r * s.seq + j];
      if (j > r) {
        EXPECT_EQ(v, 0.0f);
      }
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  Cpu c;
  const auto s = GetParam();
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 2);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), probs = c.zeros({s.batch, s.n_heads, s.seq, s.seq});
  Tensor dout = c.randn({s.batch * s.seq, s.out_width()}, 1, 3);
  auto loss = [&] {
    kernels::attention_eager_forward(out, probs, qkv, s, scale, c.ctx);
    return test::dot(out, dout);
  };
  loss();
  Tensor dqkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 4);  // garbage: must be overwritten
  kernels::attention_eager_backward(dqkv, dout, probs, qkv, s, scale, c.ctx);
  test::expect_grad_close(qkv, dqkv, loss, "dqkv", 1e-2, 2e-3, 2e-2, 120);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(kernels::AttentionShape{2, 5, 4, 2, 4},     // GQA, tiny
                                           kernels::AttentionShape{1, 70, 2, 1, 8},    // crosses a row block
                                           kernels::AttentionShape{2, 9, 3, 3, 6}));   // MHA

}  // namespace
}  // namespace scalelab
