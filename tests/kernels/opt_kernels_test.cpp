// Kernels the OPT model adds: dropout (counter-based masks), ReLU/GELU, learned positional
// embeddings, the embedding's padding row; and the low-precision paths of LayerNorm, bias+ReLU and
// the fused linear + cross-entropy, against their fp32 forms.
// Tolerances: fp32 1e-6 (identical math); bf16 storage 2^-7 relative per stored value, so outputs
// within 1.6e-2 of their scale; fp16 2e-3.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "test_util.h"

namespace scalelab::kernels {
namespace {

using test::Cpu;

Tensor to(const Tensor& t, DType dt, Cpu& cpu) {
  Tensor c = Tensor::empty(t.shape(), dt, *cpu.alloc);
  c.copy_from(t);
  return c;
}
Tensor f32(const Tensor& t, Cpu& cpu) { return to(t, DType::kF32, cpu); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(a.f32()[i] - b.f32()[i])));
  return m;
}
double max_abs(const Tensor& a) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(a.f32()[i])));
  return m;
}

TEST(Dropout, KeepsOneMinusPScaledAndRegeneratesTheMask) {
  Cpu cpu;
  const std::int64_t n = 200003;  // not a multiple of the chunk or of 4
  const float p = 0.3f;
  Tensor x = cpu.randn({n}, 1.0f, 1), orig = f32(x, cpu);
  const DropoutKey key{42, 3, 1, 0};
  dropout_forward(x, p, key, cpu.ctx);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool k = dropout_keep(p, key, i);
    kept += k;
    ASSERT_EQ(x.f32()[i], k ? orig.f32()[i] * (1.0f / (1.0f - p)) : 0.0f) << i;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.005);
  // Backward applies the same mask and scale.
  Tensor g = cpu.randn({n}, 1.0f, 2), dg = cpu.zeros({n});
  dropout_backward(dg, g, p, key, cpu.ctx);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(dg.f32()[i], dropout_keep(p, key, i) ? g.f32()[i] * (1.0f / (1.0f - p)) : 0.0f) << i;
  // Any other component of the key gives another mask.
  for (DropoutKey other : {DropoutKey{43, 3, 1, 0}, DropoutKey{42, 4, 1, 0}, DropoutKey{42, 3, 2, 0},
                           DropoutKey{42, 3, 1, 1}}) {
    std::int64_t same = 0;
    for (std::int64_t i = 0; i < 10000; ++i) same += dropout_keep(p, key, i) == dropout_keep(p, other, i);
    EXPECT_LT(same, 6500);  // independent masks agree on 0.7² + 0.3² = 58% of elements
  }
}

TEST(Dropout, ThreadCountAndDtypeIndependent) {
  Cpu cpu;
  const std::int64_t n = 100000;
  const DropoutKey key{7, 1, 0, 1};
  Tensor a = cpu.randn({n}, 1.0f, 3), b = f32(a, cpu);
  Tensor h = to(a, DType::kBF16, cpu);
  set_num_threads(1);
  dropout_forward(a, 0.1f, key, cpu.ctx);
  set_num_threads(2);
  dropout_forward(b, 0.1f, key, cpu.ctx);
  dropout_forward(h, 0.1f, key, cpu.ctx);
  set_num_threads(0);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  const Tensor hf = f32(h, cpu);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hf.f32()[i] == 0.0f, a.f32()[i] == 0.0f) << i;
  EXPECT_LT(max_abs_diff(hf, a), 2e-2 * max_abs(a));
  // p = 0 is the identity.
  Tensor c = cpu.randn({n}, 1.0f, 4), d = f32(c, cpu);
  dropout_forward(c, 0.0f, key, cpu.ctx);
  EXPECT_EQ(max_abs_diff(c, d), 0.0);
  EXPECT_THROW(dropout_forward(c, 1.0f, key, cpu.ctx), InvalidInput);
}

TEST(Activation, ReluAndGeluForwardAndFiniteDifferences) {
  Cpu cpu;
  for (Activation act : {Activation::kReLU, Activation::kGELU}) {
    Tensor x = cpu.randn({7, 33}, 1.5f, 5), y = cpu.zeros({7, 33});
    activation_forward(y, x, act, cpu.ctx);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double v = x.f32()[i];
      const double want = act == Activation::kReLU ? std::max(v, 0.0) : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      ASSERT_NEAR(y.f32()[i], want, 1e-6) << i;
    }
    Tensor r = cpu.randn({7, 33}, 1.0f, 6), dx = cpu.zeros({7, 33});
    activation_backward(dx, r, x, act, cpu.ctx);
    test::expect_grad_close(
        x, dx,
        [&] {
          Tensor yy = cpu.zeros({7, 33});
          activation_forward(yy, x, act, cpu.ctx);
          return test::dot(yy, r);
        },
        act == Activation::kReLU ? "relu" : "gelu", 1e-3, 2e-3, 1e-2);
  }
  EXPECT_THROW(parse_activation("silu"), InvalidInput);
}

TEST(Embedding, PositionsWithOffsetAndThePaddingRow) {
  Cpu cpu;
  const std::int64_t B = 3, S = 5, W = 6, off = 2;
  Tensor table = cpu.randn({S + off + 1, W}, 1.0f, 7);
  Tensor y = cpu.randn({B * S, W}, 1.0f, 8), y0 = f32(y, cpu);
  position_embedding_add_forward(y, table, S, off, cpu.ctx);
  for (std::int64_t t = 0; t < B * S; ++t)
    for (std::int64_t c = 0; c < W; ++c)
      ASSERT_FLOAT_EQ(y.f32()[t * W + c], y0.f32()[t * W + c] + table.f32()[(t % S + off) * W + c]);
  Tensor dt = cpu.zeros({S + off + 1, W});
  position_embedding_backward(dt, y0, S, off, cpu.ctx);
  for (std::int64_t r = 0; r < S + off + 1; ++r)
    for (std::int64_t c = 0; c < W; ++c) {
      double want = 0;
      if (r >= off && r < S + off)
        for (std::int64_t b = 0; b < B; ++b) want += y0.f32()[(b * S + r - off) * W + c];
      ASSERT_NEAR(dt.f32()[r * W + c], want, 1e-5) << r << "," << c;
    }
  // The table is too short for the sequence: refused.
  Tensor small = cpu.randn({S + 1, W}, 1.0f, 9);
  EXPECT_THROW(position_embedding_add_forward(y, small, S, off, cpu.ctx), RuntimeError);
  // padding_idx: the skipped row gets nothing, the others their sums.
  Tensor ids = cpu.ids({1, 4, 1, 2, 4});
  Tensor dy = cpu.randn({5, W}, 1.0f, 10), dtab = cpu.zeros({6, W});
  embedding_backward(dtab, dy, ids, cpu.ctx, /*skip_id=*/1);
  for (std::int64_t c = 0; c < W; ++c) {
    EXPECT_EQ(dtab.f32()[1 * W + c], 0.0f);
    EXPECT_FLOAT_EQ(dtab.f32()[4 * W + c], dy.f32()[1 * W + c] + dy.f32()[4 * W + c]);
    EXPECT_FLOAT_EQ(dtab.f32()[2 * W + c], dy.f32()[3 * W + c]);
  }
}

// LayerNorm in bf16/fp16 storage against fp32; the fused residual form equals add_ + layernorm
// bit for bit in every dtype (the residual is rounded before it is normalized).
TEST(LayerNormLowPrecision, MatchesFp32AndTheUnfusedComposition) {
  Cpu cpu;
  const std::int64_t T = 9, H = 40;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const double tol = dt == DType::kBF16 ? 1.6e-2 : 2e-3;
    Tensor x = cpu.randn({T, H}, 1.0f, 11), w = cpu.randn({H}, 1.0f, 12), b = cpu.randn({H}, 0.5f, 13);
    Tensor d = cpu.randn({T, H}, 1.0f, 14), dy = cpu.randn({T, H}, 1.0f, 15);
    // fp32 reference.
    Tensor y32 = cpu.zeros({T, H}), m32 = cpu.zeros({T}), r32 = cpu.zeros({T}), dx32 = cpu.zeros({T, H});
    Tensor dw32 = cpu.zeros({H}), db32 = cpu.zeros({H});
    layernorm_forward(y32, m32, r32, x, w, b, 1e-5f, cpu.ctx);
    layernorm_backward(dx32, &dw32, &db32, dy, x, m32, r32, w, cpu.ctx);
    // Low precision: tensors and parameters stored in dt.
    Tensor xl = to(x, dt, cpu), wl = to(w, dt, cpu), bl = to(b, dt, cpu), dyl = to(dy, dt, cpu);
    Tensor yl = Tensor::empty({T, H}, dt, *cpu.alloc), m = cpu.zeros({T}), r = cpu.zeros({T});
    Tensor dxl = Tensor::empty({T, H}, dt, *cpu.alloc), dwl = Tensor::zeros({H}, dt, *cpu.alloc),
           dbl = Tensor::zeros({H}, dt, *cpu.alloc);
    layernorm_forward(yl, m, r, xl, wl, bl, 1e-5f, cpu.ctx);
    layernorm_backward(dxl, &dwl, &dbl, dyl, xl, m, r, wl, cpu.ctx);
    EXPECT_LT(max_abs_diff(f32(yl, cpu), y32), tol * max_abs(y32));
    EXPECT_LT(max_abs_diff(f32(dxl, cpu), dx32), 2 * tol * max_abs(dx32));
    EXPECT_LT(max_abs_diff(f32(dwl, cpu), dw32), 2 * tol * max_abs(dw32));
    EXPECT_LT(max_abs_diff(f32(dbl, cpu), db32), 2 * tol * max_abs(db32));
    // Recompute rebuilds the stored output exactly.
    Tensor yr = Tensor::empty({T, H}, dt, *cpu.alloc);
    layernorm_recompute(yr, xl, m, r, wl, bl, cpu.ctx);
    EXPECT_EQ(max_abs_diff(f32(yr, cpu), f32(yl, cpu)), 0.0);
    // Fused residual: h = x + d (in place over d) and y = ln(h), against add_ then layernorm.
    Tensor dl = to(d, dt, cpu), h_ref = to(d, dt, cpu);
    add_(h_ref, xl, cpu.ctx);
    Tensor y_ref = Tensor::empty({T, H}, dt, *cpu.alloc), mr = cpu.zeros({T}), rr = cpu.zeros({T});
    layernorm_forward(y_ref, mr, rr, h_ref, wl, bl, 1e-5f, cpu.ctx);
    Tensor yf = Tensor::empty({T, H}, dt, *cpu.alloc), mf = cpu.zeros({T}), rf = cpu.zeros({T});
    layernorm_residual_forward(dl, yf, mf, rf, xl, dl, wl, bl, 1e-5f, cpu.ctx);
    EXPECT_EQ(max_abs_diff(f32(dl, cpu), f32(h_ref, cpu)), 0.0);
    EXPECT_EQ(max_abs_diff(f32(yf, cpu), f32(y_ref, cpu)), 0.0);
    EXPECT_EQ(max_abs_diff(mf, mr), 0.0);
    EXPECT_EQ(max_abs_diff(rf, rr), 0.0);
  }
}

TEST(BiasReluLowPrecision, MatchesFp32) {
  Cpu cpu;
  const std::int64_t T = 11, F = 37;
  Tensor x = cpu.randn({T, F}, 1.0f, 16), b = cpu.randn({F}, 0.5f, 17), dy = cpu.randn({T, F}, 1.0f, 18);
  Tensor y = cpu.zeros({T, F}), dx = cpu.zeros({T, F}), db = cpu.zeros({F});
  bias_relu_forward(y, x, b, cpu.ctx);
  bias_relu_backward(dx, &db, dy, y, cpu.ctx);
  Tensor xl = to(x, DType::kBF16, cpu), bl = to(b, DType::kBF16, cpu), dyl = to(dy, DType::kBF16, cpu);
  Tensor dbl = Tensor::zeros({F}, DType::kBF16, *cpu.alloc);
  bias_relu_forward(xl, xl, bl, cpu.ctx);  // in place, as the model does
  bias_relu_backward(dyl, &dbl, dyl, xl, cpu.ctx);
  EXPECT_LT(max_abs_diff(f32(xl, cpu), y), 1.6e-2 * max_abs(y));
  EXPECT_LT(max_abs_diff(f32(dbl, cpu), db), 3e-2 * max_abs(db));
  const Tensor dxl = f32(dyl, cpu);
  for (std::int64_t i = 0; i < dx.numel(); ++i) {
    if (std::fabs(y.f32()[i]) > 0.05f) {
      ASSERT_NEAR(dxl.f32()[i], dx.f32()[i], 1e-2 * std::fabs(dx.f32()[i]) + 1e-6) << i;
    }
  }
}

// The fused loss over bf16 operands against the fp32 one, and its allocations against
// fused_linear_cross_entropy_workspace_blocks: never a [T, V] buffer.
TEST(FusedLossLowPrecision, StagesOperandsAndMatchesFp32) {
  Cpu cpu;
  const std::int64_t T = 37, H = 24, V = 50;
  Tensor x = cpu.randn({T, H}, 1.0f, 19), w = cpu.randn({V, H}, 0.3f, 20);
  std::vector<std::int32_t> tv;
  for (std::int64_t t = 0; t < T; ++t) tv.push_back(t % 7 == 3 ? kIgnoreIndex : static_cast<std::int32_t>((t * 13) % V));
  Tensor targets = cpu.ids(tv);
  const std::int64_t count = count_target_tokens(targets);
  const float scale = 1.0f / static_cast<float>(count);
  Tensor dx = cpu.zeros({T, H}), dw = cpu.zeros({V, H});
  const LossSum ref = fused_linear_cross_entropy(dx, dw, x, w, targets, scale, 8, cpu.ctx);
  Tensor xl = to(x, DType::kBF16, cpu), wl = to(w, DType::kBF16, cpu);
  Tensor dxl = Tensor::empty({T, H}, DType::kBF16, *cpu.alloc), dwl = Tensor::zeros({V, H}, DType::kBF16, *cpu.alloc);
  std::vector<AllocEvent> trace;
  cpu.alloc->set_trace(&trace);
  const LossSum low = fused_linear_cross_entropy(dxl, dwl, xl, wl, targets, scale, 8, cpu.ctx);
  cpu.alloc->set_trace(nullptr);
  EXPECT_EQ(low.count, ref.count);
  EXPECT_NEAR(low.sum / low.count, ref.sum / ref.count, 1e-2 * ref.sum / ref.count);
  EXPECT_LT(max_abs_diff(f32(dxl, cpu), dx), 3e-2 * max_abs(dx));
  EXPECT_LT(max_abs_diff(f32(dwl, cpu), dw), 3e-2 * max_abs(dw));
  // Allocations: the kernel's blocks first (one chunk of logits, the chunk's fp32 input rows), then
  // only GEMM panels; nothing as large as the [T, V] logits.
  const auto blocks =
      fused_linear_cross_entropy_workspace_blocks(T, 8, H, V, DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16, true);
  std::vector<std::size_t> allocs;
  for (const AllocEvent& e : trace)
    if (e.alloc) allocs.push_back(e.bytes);
  ASSERT_GE(allocs.size(), blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(allocs[i], DeviceAllocator::round_size(blocks[i])) << i;
  for (std::size_t b : allocs) EXPECT_LT(b, static_cast<std::size_t>(T * V * 4));
  // Forward only agrees.
  const LossSum fwd = fused_linear_cross_entropy_forward(xl, wl, targets, 8, cpu.ctx);
  EXPECT_NEAR(fwd.sum, low.sum, 1e-4 * std::fabs(low.sum));
}

}  // namespace
}  // namespace scalelab::kernels
