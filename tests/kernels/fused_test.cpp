// Fused kernels (kernels/fused.h) against the unfused compositions they replace, plus finite
// differences for the new backward paths and the memory bound of the chunked loss.
// Tolerance (fp32): values and gradients within 1e-5 relative (plus a 1e-6 absolute floor for
// entries near zero); the fused kernels sum rows in a different order than the reference ones.
#include <cmath>
#include <cstring>

#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/fused.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "test_util.h"

namespace scalelab {
namespace {

using test::clone;
using test::Cpu;
using test::expect_close;
using kernels::kIgnoreIndex;

void expect_bitwise(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << what;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm + residual
// ---------------------------------------------------------------------------------------------

TEST(FusedRMSNorm, ResidualForwardEqualsAddThenNorm) {
  Cpu c;
  const std::int64_t R = 37, H = 29;  // odd width: vector body and scalar tail
  Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3);
  // Unfused: delta += x (the model's add_), then rmsnorm_forward.
  Tensor h_ref = clone(c, delta), y_ref = c.zeros({R, H}), rstd_ref = c.zeros({R});
  kernels::add_(h_ref, x, c.ctx);
  kernels::rmsnorm_forward(y_ref, rstd_ref, h_ref, w, 1e-5f, c.ctx);
  // Fused, h aliasing delta (the in-place residual add the model does).
  Tensor h = clone(c, delta), y = c.zeros({R, H}), rstd = c.zeros({R});
  kernels::rmsnorm_residual_forward(h, y, rstd, x, h, w, 1e-5f, c.ctx);
  expect_bitwise(h, h_ref, "h");  // one float add per element either way
  expect_close(rstd, rstd_ref, "rstd");
  expect_close(y, y_ref, "y");
  // And into a separate h.
  Tensor h2 = c.zeros({R, H}), y2 = c.zeros({R, H}), rstd2 = c.zeros({R});
  kernels::rmsnorm_residual_forward(h2, y2, rstd2, x, delta, w, 1e-5f, c.ctx);
  expect_bitwise(h2, h_ref, "h (separate)");
  expect_bitwise(y2, y, "y (separate)");
}

TEST(FusedRMSNorm, ResidualBackwardEqualsNormBackwardAndFiniteDifferences) {
  Cpu c;
  const std::int64_t R = 37, H = 29;
  Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3);
  Tensor gh = c.randn({R, H}, 1, 4), gy = c.randn({R, H}, 1, 5);  // upstream grads of h and y
  Tensor h = c.zeros({R, H}), y = c.zeros({R, H}), rstd = c.zeros({R});
  // L = <h, gh> + <y, gy>: h feeds the next residual add, y the next projection.
  auto loss = [&] {
    kernels::rmsnorm_residual_forward(h, y, rstd, x, delta, w, 1e-5f, c.ctx);
    return test::dot(h, gh) + test::dot(y, gy);
  };
  loss();
  Tensor dh = clone(c, gh), dw = c.randn({H}, 1, 6);
  Tensor dh_ref = clone(c, gh), dw_ref = clone(c, dw);
  kernels::rmsnorm_residual_backward(dh, dw, gy, h, rstd, w, c.ctx);
  kernels::rmsnorm_backward(dh_ref, dw_ref, gy, h, rstd, w, c.ctx, /*accumulate_dx=*/true);
  expect_close(dh, dh_ref, "dh");
  expect_close(dw, dw_ref, "dw");
  // dh is the gradient of x and of delta; dw accumulated onto its initial value.
  Tensor dw_only = clone(c, dw);
  Tensor dw0 = c.randn({H}, 1, 6);
  for (std::int64_t i = 0; i < H; ++i) dw_only.f32()[i] -= dw0.f32()[i];
  test::expect_grad_close(x, dh, loss, "dx");
  test::expect_grad_close(delta, dh, loss, "ddelta");
  test::expect_grad_close(w, dw_only, loss, "dw");
}

TEST(FusedRMSNorm, RecomputeIsBitIdentical) {
  Cpu c;
  const std::int64_t R = 19, H = 45;
  Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3);
  Tensor h = c.zeros({R, H}), y = c.zeros({R, H}), rstd = c.zeros({R}), y2 = c.zeros({R, H});
  kernels::rmsnorm_residual_forward(h, y, rstd, x, delta, w, 1e-5f, c.ctx);
  kernels::rmsnorm_recompute(y2, h, rstd, w, c.ctx);
  expect_bitwise(y2, y, "recomputed y");
}

// ---------------------------------------------------------------------------------------------
// LayerNorm + residual
// ---------------------------------------------------------------------------------------------

TEST(FusedLayerNorm, ResidualForwardEqualsAddThenNorm) {
  Cpu c;
  const std::int64_t R = 23, H = 27;
  Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3), b = c.randn({H}, 1, 4);
  for (int affine = 0; affine < 2; ++affine) {
    const Tensor wa = affine ? w : Tensor(), ba = affine ? b : Tensor();
    Tensor h_ref = c.zeros({R, H}), y_ref = c.zeros({R, H}), m_ref = c.zeros({R}), r_ref = c.zeros({R});
    kernels::add(h_ref, x, delta, c.ctx);
    kernels::layernorm_forward(y_ref, m_ref, r_ref, h_ref, wa, ba, 1e-5f, c.ctx);
    Tensor h = clone(c, x), y = c.zeros({R, H}), m = c.zeros({R}), r = c.zeros({R});
    kernels::layernorm_residual_forward(h, y, m, r, h, delta, wa, ba, 1e-5f, c.ctx);  // h aliases x
    expect_bitwise(h, h_ref, "h");
    // The fused form reads the row once while adding; the statistics come out the same.
    expect_bitwise(m, m_ref, "mean");
    expect_bitwise(r, r_ref, "rstd");
    expect_bitwise(y, y_ref, "y");
    Tensor y2 = c.zeros({R, H});
    kernels::layernorm_recompute(y2, h, m, r, wa, ba, c.ctx);
    expect_bitwise(y2, y, "recomputed y");
  }
}

TEST(FusedLayerNorm, ResidualBackwardMatchesFiniteDifferences) {
  Cpu c;
  const std::int64_t R = 21, H = 13;
  Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3), b = c.randn({H}, 1, 4);
  Tensor gh = c.randn({R, H}, 1, 5), gy = c.randn({R, H}, 1, 6);
  Tensor h = c.zeros({R, H}), y = c.zeros({R, H}), m = c.zeros({R}), r = c.zeros({R});
  auto loss = [&] {
    kernels::layernorm_residual_forward(h, y, m, r, x, delta, w, b, 1e-5f, c.ctx);
    return test::dot(h, gh) + test::dot(y, gy);
  };
  loss();
  Tensor dh = clone(c, gh), dw = c.zeros({H}), db = c.zeros({H});
  kernels::layernorm_residual_backward(dh, &dw, &db, gy, h, m, r, w, c.ctx);
  Tensor dh_ref = clone(c, gh), dw_ref = c.zeros({H}), db_ref = c.zeros({H});
  kernels::layernorm_backward(dh_ref, &dw_ref, &db_ref, gy, h, m, r, w, c.ctx, /*accumulate_dx=*/true);
  expect_bitwise(dh, dh_ref, "dh");
  test::expect_grad_close(x, dh, loss, "dx");
  test::expect_grad_close(delta, dh, loss, "ddelta");
  test::expect_grad_close(w, dw, loss, "dw");
  test::expect_grad_close(b, db, loss, "db");
}

// ---------------------------------------------------------------------------------------------
// SwiGLU recomputed in backward
// ---------------------------------------------------------------------------------------------

TEST(FusedSwiGLU, BackwardRecomputeEqualsForwardAndBackward) {
  Cpu c;
  const std::int64_t T = 7, I = 21;  // odd I: vector body and scalar tail in each half
  Tensor gu = c.randn({T, 2 * I}, 2, 1), dh = c.randn({T, I}, 1, 2);
  Tensor act_ref = c.zeros({T, I}), dgu_ref = c.zeros({T, 2 * I});
  kernels::swiglu_forward(act_ref, gu, c.ctx);
  kernels::swiglu_backward(dgu_ref, dh, gu, c.ctx);
  Tensor act = c.zeros({T, I}), dgu = c.zeros({T, 2 * I});
  kernels::swiglu_backward_recompute(dgu, act, dh, gu, c.ctx);
  expect_close(act, act_ref, "act");
  expect_close(dgu, dgu_ref, "dgu");
  // In place: act over dh and dgu over gu.
  Tensor dh2 = clone(c, dh), gu2 = clone(c, gu);
  kernels::swiglu_backward_recompute(gu2, dh2, dh2, gu2, c.ctx);
  expect_bitwise(dh2, act, "act in place");
  expect_bitwise(gu2, dgu, "dgu in place");
}

TEST(FusedSwiGLU, DownBackwardRecomputeEqualsUnfused) {
  Cpu c;
  const std::int64_t T = 11, H = 9, I = 17;
  Tensor gu = c.randn({T, 2 * I}, 1.5, 1), wdown = c.randn({H, I}, 0.3, 2), dout = c.randn({T, H}, 1, 3);
  // Unfused: the activation was kept from forward.
  Tensor act = c.zeros({T, I}), dact = c.zeros({T, I}), dgu_ref = c.zeros({T, 2 * I});
  Tensor dw_ref = c.randn({H, I}, 1, 4);
  kernels::swiglu_forward(act, gu, c.ctx);
  kernels::linear_backward(&dact, dw_ref, nullptr, dout, act, wdown, c.ctx);
  kernels::swiglu_backward(dgu_ref, dact, gu, c.ctx);
  // Fused: no activation kept; dgu written over gu.
  Tensor dw = c.randn({H, I}, 1, 4), dgu = clone(c, gu);
  const std::size_t before = c.alloc->stats().allocated;
  c.alloc->reset_peaks();
  kernels::swiglu_down_backward_recompute(dgu, dw, dout, dgu, wdown, c.ctx);
  const MemoryStats st = c.alloc->stats();
  EXPECT_EQ(st.allocated, before);  // the scratch is returned
  EXPECT_EQ(st.peak_allocated - before, DeviceAllocator::round_size(T * I * sizeof(float)));
  expect_close(dgu, dgu_ref, "dgu");
  expect_close(dw, dw_ref, "dwdown");
}

// ---------------------------------------------------------------------------------------------
// Bias + ReLU
// ---------------------------------------------------------------------------------------------

// Inputs kept away from the kink at 0 so that central differences are exact for ReLU.
Tensor away_from_zero(Cpu& c, const Shape& s, const Tensor& b, std::uint32_t seed) {
  Tensor x = c.randn(s, 1, seed);
  const std::int64_t F = s[-1];
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    float v = x.f32()[i] + (b.defined() ? b.f32()[i % F] : 0.0f);
    if (std::fabs(v) < 0.1f) x.f32()[i] += v < 0 ? -0.2f : 0.2f;
  }
  return x;
}

TEST(FusedBiasReLU, ForwardMatchesDefinitionInPlace) {
  Cpu c;
  const std::int64_t T = 9, F = 35;
  Tensor b = c.randn({F}, 1, 1), x = c.randn({T, F}, 1, 2);
  Tensor y = c.zeros({T, F});
  kernels::bias_relu_forward(y, x, b, c.ctx);
  for (std::int64_t i = 0; i < T * F; ++i)
    EXPECT_EQ(y.f32()[i], std::max(x.f32()[i] + b.f32()[i % F], 0.0f)) << i;
  Tensor xi = clone(c, x);
  kernels::bias_relu_forward(xi, xi, b, c.ctx);  // in place over the GEMM output
  expect_bitwise(xi, y, "in place");
  // Unfused composition: bias added by linear_forward, then ReLU.
  Tensor in = c.randn({T, 6}, 1, 3), w = c.randn({F, 6}, 1, 4), u = c.zeros({T, F}), y_ref = c.zeros({T, F});
  kernels::linear_forward(u, in, w, &b, c.ctx);
  kernels::bias_relu_forward(y_ref, u, Tensor(), c.ctx);
  Tensor yf = c.zeros({T, F});
  kernels::linear_forward(yf, in, w, nullptr, c.ctx);
  kernels::bias_relu_forward(yf, yf, b, c.ctx);
  expect_bitwise(yf, y_ref, "fused vs linear-with-bias then relu");
  // NaN stays NaN, as torch.relu.
  Tensor n = c.zeros({1, 1});
  n.f32()[0] = NAN;
  kernels::bias_relu_forward(n, n, Tensor(), c.ctx);
  EXPECT_TRUE(std::isnan(n.f32()[0]));
}

TEST(FusedBiasReLU, BackwardMatchesFiniteDifferences) {
  Cpu c;
  const std::int64_t T = 37, F = 19;
  Tensor b = c.randn({F}, 1, 1);
  Tensor x = away_from_zero(c, {T, F}, b, 2), dy = c.randn({T, F}, 1, 3);
  Tensor y = c.zeros({T, F});
  auto loss = [&] {
    kernels::bias_relu_forward(y, x, b, c.ctx);
    return test::dot(y, dy);
  };
  loss();
  Tensor dx = c.zeros({T, F}), db = c.zeros({F});
  kernels::bias_relu_backward(dx, &db, dy, y, c.ctx);
  test::expect_grad_close(x, dx, loss, "dx", 1e-3);
  test::expect_grad_close(b, db, loss, "db", 1e-3);
  // In place over dy, and db accumulates.
  Tensor dyi = clone(c, dy);
  kernels::bias_relu_backward(dyi, &db, dyi, y, c.ctx);
  expect_bitwise(dyi, dx, "dx in place");
  Tensor db1 = c.zeros({F});
  kernels::bias_relu_backward(dx, &db1, dy, y, c.ctx);
  for (std::int64_t j = 0; j < F; ++j) EXPECT_NEAR(db.f32()[j], 2 * db1.f32()[j], 1e-5 * (1 + std::fabs(db1.f32()[j])));
  // Without a bias.
  Tensor dx2 = c.zeros({T, F});
  kernels::bias_relu_backward(dx2, nullptr, dy, y, c.ctx);
  expect_bitwise(dx2, dx, "dx without bias gradient");
}

// ---------------------------------------------------------------------------------------------
// Linear + cross-entropy
// ---------------------------------------------------------------------------------------------

struct Unfused {
  kernels::LossSum loss;
  Tensor dx, dw;
};

// linear_forward + cross_entropy_forward/backward + linear_backward, as the model does today.
Unfused unfused_head(Cpu& c, const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& dw0, float scale) {
  const std::int64_t T = x.dim(0), H = x.dim(1), V = w.dim(0);
  Unfused u;
  Tensor logits = c.zeros({T, V}), lse = c.zeros({T});
  kernels::linear_forward(logits, x, w, nullptr, c.ctx);
  u.loss = kernels::cross_entropy_forward(lse, logits, targets, c.ctx);
  kernels::cross_entropy_backward(logits, logits, lse, targets, scale, c.ctx);
  u.dx = c.zeros({T, H});
  u.dw = clone(c, dw0);
  kernels::linear_backward(&u.dx, u.dw, nullptr, logits, x, w, c.ctx);
  return u;
}

std::vector<std::int32_t> make_targets(std::int64_t T, std::int64_t V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(T));
  for (std::int64_t i = 0; i < T; ++i)
    t[static_cast<std::size_t>(i)] = i % 5 == 3 ? kIgnoreIndex : static_cast<std::int32_t>(rng() % V);
  return t;
}

TEST(FusedLinearCrossEntropy, EqualsUnfusedOnOddShapes) {
  Cpu c;
  const std::int64_t T = 37, H = 19, V = 53;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.5, 2), dw0 = c.randn({V, H}, 0.1, 3);
  Tensor targets = c.ids(make_targets(T, V, 4));
  const std::int64_t n = kernels::count_target_tokens(targets);
  ASSERT_EQ(n, 30);
  const float scale = 0.5f / static_cast<float>(n);  // grad_scale 0.5 (e.g. 1 / grad-accum steps)
  const Unfused ref = unfused_head(c, x, w, targets, dw0, scale);
  for (std::int64_t chunk : {8, 1, 37, 1000}) {  // several chunks with a remainder, one row, all, more than all
    Tensor dx = c.randn({T, H}, 1, 9), dw = clone(c, dw0);  // dx garbage: it is assigned
    const auto got = kernels::fused_linear_cross_entropy(dx, dw, x, w, targets, scale, chunk, c.ctx);
    EXPECT_EQ(got.count, ref.loss.count) << chunk;
    EXPECT_NEAR(got.sum, ref.loss.sum, 1e-5 * std::fabs(ref.loss.sum)) << chunk;
    expect_close(dx, ref.dx, "dx");
    expect_close(dw, ref.dw, "dw");
  }
  // Ignored rows have zero input gradient.
  Tensor dx = c.zeros({T, H}), dw = clone(c, dw0);
  kernels::fused_linear_cross_entropy(dx, dw, x, w, targets, scale, 8, c.ctx);
  for (std::int64_t i = 0; i < H; ++i) EXPECT_EQ(dx.f32()[3 * H + i], 0.0f);
  // Forward only gives the same loss.
  const auto fwd = kernels::fused_linear_cross_entropy_forward(x, w, targets, 8, c.ctx);
  EXPECT_EQ(fwd.count, ref.loss.count);
  EXPECT_NEAR(fwd.sum, ref.loss.sum, 1e-5 * std::fabs(ref.loss.sum));
}

TEST(FusedLinearCrossEntropy, ForwardOnlyOverVocabularyTilesEqualsUnfused) {
  // V large enough against the scratch that the forward-only kernel cuts the vocabulary into
  // several tiles and the tokens into several blocks (online log-sum-exp across tiles).
  Cpu c;
  const std::int64_t T = 37, H = 19, V = 600;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.5, 2);
  std::vector<std::int32_t> tv = make_targets(T, V, 4);
  tv[0] = 0;
  tv[1] = static_cast<std::int32_t>(V - 1);  // targets in the first and the last tile
  Tensor targets = c.ids(tv);
  Tensor logits = c.zeros({T, V}), lse = c.zeros({T});
  kernels::linear_forward(logits, x, w, nullptr, c.ctx);
  const auto want = kernels::cross_entropy_forward(lse, logits, targets, c.ctx);
  for (std::int64_t chunk : {1, 8, 37}) {
    const auto got = kernels::fused_linear_cross_entropy_forward(x, w, targets, chunk, c.ctx);
    EXPECT_EQ(got.count, want.count) << chunk;
    EXPECT_NEAR(got.sum, want.sum, 1e-5 * std::fabs(want.sum)) << chunk;
  }
}

TEST(FusedLinearCrossEntropy, GradientsMatchFiniteDifferences) {
  Cpu c;
  const std::int64_t T = 9, H = 7, V = 11;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.7, 2);
  Tensor targets = c.ids(make_targets(T, V, 3));
  const std::int64_t n = kernels::count_target_tokens(targets);
  auto loss = [&] { return kernels::fused_linear_cross_entropy_forward(x, w, targets, 4, c.ctx).sum / n; };
  Tensor dx = c.zeros({T, H}), dw = c.zeros({V, H});
  kernels::fused_linear_cross_entropy(dx, dw, x, w, targets, 1.0f / static_cast<float>(n), 4, c.ctx);
  test::expect_grad_close(x, dx, loss, "dx", 1e-2, 1e-3, 1e-2, 63);
  test::expect_grad_close(w, dw, loss, "dw", 1e-2, 1e-3, 1e-2, 77);
}

TEST(FusedLinearCrossEntropy, PeakMemoryIsOneChunkNotTheLogits) {
  Cpu c;
  const std::int64_t T = 512, H = 64, V = 4096, chunk = 64;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.2, 2), dx = c.zeros({T, H}), dw = c.zeros({V, H});
  std::vector<std::int32_t> tv = make_targets(T, V, 3);
  for (std::int64_t i = 128; i < 192; ++i) tv[static_cast<std::size_t>(i)] = kIgnoreIndex;  // a padded chunk
  Tensor targets = c.ids(tv);
  const std::int64_t n = kernels::count_target_tokens(targets);
  const std::size_t before = c.alloc->stats().allocated;
  c.alloc->reset_peaks();
  const auto got = kernels::fused_linear_cross_entropy(dx, dw, x, w, targets, 1.0f / static_cast<float>(n), chunk, c.ctx);
  const MemoryStats st = c.alloc->stats();
  const std::size_t logits_bytes = static_cast<std::size_t>(T * V) * sizeof(float);
  EXPECT_LT(st.peak_allocated - before, logits_bytes / 4);
  EXPECT_EQ(st.peak_allocated - before, kernels::fused_linear_cross_entropy_workspace_bytes(chunk, V));
  EXPECT_EQ(st.allocated, before);
  // Forward only: the same bound.
  c.alloc->reset_peaks();
  kernels::fused_linear_cross_entropy_forward(x, w, targets, chunk, c.ctx);
  EXPECT_EQ(c.alloc->stats().peak_allocated - before, kernels::fused_linear_cross_entropy_workspace_bytes(chunk, V));
  // And it is the same loss and gradients as the unfused head, which does hold the logits.
  EXPECT_EQ(got.count, n);
  const Unfused ref = unfused_head(c, x, w, targets, c.zeros({V, H}), 1.0f / static_cast<float>(n));
  EXPECT_NEAR(got.sum, ref.loss.sum, 1e-5 * std::fabs(ref.loss.sum));
  expect_close(dx, ref.dx, "dx");
  expect_close(dw, ref.dw, "dw");
  for (std::int64_t i = 128 * H; i < 192 * H; ++i) ASSERT_EQ(dx.f32()[i], 0.0f);
}

TEST(FusedLinearCrossEntropy, IsDeterministic) {
  Cpu c;
  const std::int64_t T = 70, H = 24, V = 101;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.5, 2);
  Tensor targets = c.ids(make_targets(T, V, 5));
  Tensor dx1 = c.zeros({T, H}), dw1 = c.zeros({V, H}), dx2 = c.zeros({T, H}), dw2 = c.zeros({V, H});
  const auto a = kernels::fused_linear_cross_entropy(dx1, dw1, x, w, targets, 0.01f, 16, c.ctx);
  const auto b = kernels::fused_linear_cross_entropy(dx2, dw2, x, w, targets, 0.01f, 16, c.ctx);
  EXPECT_EQ(a.sum, b.sum);
  EXPECT_EQ(a.count, b.count);
  expect_bitwise(dx1, dx2, "dx");
  expect_bitwise(dw1, dw2, "dw");
}

// A frozen head (LoRA, --freeze): dw undefined. The loss and the input gradient are those of the
// call with a weight gradient, bit for bit (dx never reads dw), in fp32 (vocabulary split over
// threads) and with low-precision tensors (the plain chunk loop); no dw GEMM runs.
TEST(FusedLinearCrossEntropy, FrozenHeadHasNoWeightGradientAndTheSameRest) {
  Cpu c;
  const std::int64_t T = 37, H = 12, V = 53;
  Tensor targets = c.ids(make_targets(T, V, 5));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.5, 2);
    if (dt != DType::kF32) {
      Tensor xl = Tensor::empty({T, H}, dt, *c.alloc), wl = Tensor::empty({V, H}, dt, *c.alloc);
      xl.copy_from(x);
      wl.copy_from(w);
      x = xl;
      w = wl;
    }
    Tensor dx1 = Tensor::zeros({T, H}, dt, *c.alloc), dx2 = Tensor::zeros({T, H}, dt, *c.alloc);
    Tensor dw = c.zeros({V, H}), frozen;
    const auto a = kernels::fused_linear_cross_entropy(dx1, dw, x, w, targets, 0.03f, 8, c.ctx);
    const auto b = kernels::fused_linear_cross_entropy(dx2, frozen, x, w, targets, 0.03f, 8, c.ctx);
    EXPECT_EQ(a.sum, b.sum) << dtype_name(dt);
    EXPECT_EQ(a.count, b.count) << dtype_name(dt);
    EXPECT_EQ(std::memcmp(dx1.raw(), dx2.raw(), static_cast<std::size_t>(T * H) * dtype_size(dt)), 0) << dtype_name(dt);
    EXPECT_FALSE(frozen.defined());
  }
}

TEST(FusedLinearCrossEntropy, EdgeCases) {
  Cpu c;
  const std::int64_t T = 6, H = 5, V = 7;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 1, 2), dx = c.randn({T, H}, 1, 3);
  Tensor dw = c.randn({V, H}, 1, 4), dw0 = clone(c, dw);
  // Every target ignored: no loss, zero input gradient, the weight gradient untouched.
  Tensor none = c.ids(std::vector<std::int32_t>(T, kIgnoreIndex));
  const auto z = kernels::fused_linear_cross_entropy(dx, dw, x, w, none, 1.0f, 4, c.ctx);
  EXPECT_EQ(z.count, 0);
  EXPECT_EQ(z.sum, 0.0);
  for (std::int64_t i = 0; i < T * H; ++i) ASSERT_EQ(dx.f32()[i], 0.0f);
  expect_bitwise(dw, dw0, "dw untouched");
  // A target outside the vocabulary is refused before any output changes.
  Tensor bad = c.ids({1, 2, 3, 7, 0, 0});
  EXPECT_THROW(kernels::fused_linear_cross_entropy(dx, dw, x, w, bad, 1.0f, 4, c.ctx), InvalidInput);
  EXPECT_THROW(kernels::fused_linear_cross_entropy_forward(x, w, bad, 4, c.ctx), InvalidInput);
  expect_bitwise(dw, dw0, "dw untouched after a bad target");
}

TEST(FusedLinearCrossEntropy, DefaultChunkIsBoundedAndIndependentOfTokens) {
  using kernels::fused_linear_cross_entropy_chunk;
  using kernels::fused_linear_cross_entropy_default_chunk;
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(32768), 512);   // llama-small: 64 MiB
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(49152), 256);   // SmolLM2: 48 MiB
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(50272), 256);   // OPT: 49 MiB
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(128256), 256);  // Llama 3: 125 MiB, the floor
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(1 << 20), 256);  // the floor
  for (std::int64_t v : {256, 32768, 49152, 50272, 65536})
    EXPECT_LE(fused_linear_cross_entropy_default_chunk(v) * v * 4, std::int64_t{64} << 20) << v;
  EXPECT_EQ(fused_linear_cross_entropy_chunk(100, 0, 32768), 100);  // capped at the tokens
  EXPECT_EQ(fused_linear_cross_entropy_chunk(65536, 0, 32768), 512);
  EXPECT_EQ(fused_linear_cross_entropy_chunk(100, 7, 32768), 7);
  EXPECT_EQ(kernels::fused_linear_cross_entropy_workspace_bytes(512, 32768), std::size_t{64} << 20);
  EXPECT_EQ(kernels::fused_linear_cross_entropy_workspace_bytes(3, 5), DeviceAllocator::kRoundBytes);
}

TEST(FusedLinearCrossEntropy, GpuDefaultChunkIsLargerAndTheMetaPlanFollowsIt) {
  using kernels::fused_linear_cross_entropy_default_chunk;
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(128256, DeviceType::kCUDA), 2048);  // 0.98 GiB
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(50272, DeviceType::kCUDA), 4096);   // 0.77 GiB
  EXPECT_EQ(fused_linear_cross_entropy_default_chunk(128256, DeviceType::kCPU), 256);
  for (std::int64_t v : {256, 32768, 50272, 128256})
    EXPECT_LE(fused_linear_cross_entropy_default_chunk(v, DeviceType::kCUDA) * v * 4, std::int64_t{1} << 30) << v;
  // On meta, the front sizes the chunk for the planned device: the one workspace block of a
  // fp32 call is [chunk, V] fp32.
  const std::int64_t T = 8192, H = 16, V = 50272;
  for (DeviceType planned : {DeviceType::kCPU, DeviceType::kCUDA}) {
    DeviceAllocator meta(make_meta_backend(), std::size_t{1} << 40);
    ExecContext ctx{&meta, nullptr};
    ctx.options.planned_device = planned;
    Tensor x = Tensor::empty({T, H}, DType::kF32, meta), w = Tensor::empty({V, H}, DType::kF32, meta);
    Tensor dx = Tensor::empty({T, H}, DType::kF32, meta), dw = Tensor::empty({V, H}, DType::kF32, meta);
    Tensor tg = Tensor::empty({T}, DType::kI32, meta);
    const std::size_t before = meta.stats().allocated;
    kernels::fused_linear_cross_entropy(dx, dw, x, w, tg, 1.0f, 0, ctx);
    const std::size_t chunk = static_cast<std::size_t>(fused_linear_cross_entropy_default_chunk(V, planned));
    // The block is the rounded request, or its whole 2 MiB-rounded segment when the remainder is
    // too small to split off (core/allocator.h).
    const std::size_t got = meta.stats().peak_allocated - before, want = DeviceAllocator::round_size(chunk * V * 4);
    EXPECT_GE(got, want) << device_type_name(planned);
    EXPECT_LT(got, want + DeviceAllocator::kSegmentBytes) << device_type_name(planned);
  }
}

}  // namespace
}  // namespace scalelab
