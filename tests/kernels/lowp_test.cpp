// Low-precision storage: each kernel on bf16/fp16 tensors equals the fp32 kernel applied to the
// same (rounded) inputs, within the output dtype's rounding. Tolerances: bf16 carries 8
// significant bits (relative step 2^-8 ≈ 0.4%), fp16 11 bits (≈ 0.05%); we allow a few steps
// because outputs are rounded once and some inputs pass through two roundings.
#include <cmath>

#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "test_util.h"

namespace scalelab {
namespace {

using test::Cpu;

// Rounds an fp32 tensor to dtype dt in place and returns the rounded copy of dtype dt.
Tensor to_dtype(Cpu& c, Tensor& f32, DType dt) {
  Tensor t = Tensor::empty(f32.shape(), dt, *c.alloc);
  t.copy_from(f32);
  f32.copy_from(t);  // f32 now holds exactly the rounded values
  return t;
}
Tensor as_f32(Cpu& c, const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::kF32, *c.alloc);
  f.copy_from(t);
  return f;
}
double tol(DType dt) { return dt == DType::kBF16 ? 1.6e-2 : 2e-3; }
void expect_close(Cpu& c, const Tensor& got, const Tensor& want, DType dt, const char* what, double atol = 1e-3) {
  Tensor g = as_f32(c, got);
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.f32()[i];
    ASSERT_NEAR(g.f32()[i], w, atol + tol(dt) * std::fabs(w)) << what << " element " << i;
  }
}

class LowPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(LowPrecision, LinearForwardBackwardMixedDtypes) {
  const DType dt = GetParam();
  Cpu c;
  const std::int64_t T = 37, in = 70, out = 53;  // odd sizes cross panel edges
  Tensor x = c.randn({T, in}, 1, 1), w = c.randn({out, in}, 0.2f, 2), dy = c.randn({T, out}, 1, 3);
  Tensor xl = to_dtype(c, x, dt), wl = to_dtype(c, w, dt), dyl = to_dtype(c, dy, dt);
  Tensor y = c.zeros({T, out}), yl = Tensor::empty({T, out}, dt, *c.alloc);
  kernels::linear_forward(y, x, w, nullptr, c.ctx);
  kernels::linear_forward(yl, xl, wl, nullptr, c.ctx);
  expect_close(c, yl, y, dt, "y");
  // Backward: low-precision dx, and the weight gradient accumulated into fp32 (mixed precision)
  // and into the low dtype (full low-precision training).
  Tensor dx = c.zeros({T, in}), dw = c.zeros({out, in});
  kernels::linear_backward(&dx, dw, nullptr, dy, x, w, c.ctx);
  Tensor dxl = Tensor::empty({T, in}, dt, *c.alloc), dw32 = c.zeros({out, in});
  Tensor dwl = Tensor::zeros({out, in}, dt, *c.alloc);
  kernels::linear_backward(&dxl, dw32, nullptr, dyl, xl, wl, c.ctx);
  kernels::linear_backward(nullptr, dwl, nullptr, dyl, xl, wl, c.ctx);
  expect_close(c, dxl, dx, dt, "dx");
  for (std::int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw32.f32()[i], dw.f32()[i], 1e-4) << i;
  expect_close(c, dwl, dw, dt, "dw", 2e-2);
}

TEST_P(LowPrecision, NormRopeActivationEmbeddingAdd) {
  const DType dt = GetParam();
  Cpu c;
  const std::int64_t R = 9, H = 32;
  Tensor x = c.randn({R, H}, 1, 1), w = c.randn({H}, 1, 2);
  Tensor xl = to_dtype(c, x, dt), wl = to_dtype(c, w, dt);
  Tensor y = c.zeros({R, H}), r1 = c.zeros({R}), yl = Tensor::empty({R, H}, dt, *c.alloc), r2 = c.zeros({R});
  kernels::rmsnorm_forward(y, r1, x, w, 1e-5f, c.ctx);
  kernels::rmsnorm_forward(yl, r2, xl, wl, 1e-5f, c.ctx);
  expect_close(c, yl, y, dt, "rmsnorm");
  Tensor dy = c.randn({R, H}, 1, 3), dyl = to_dtype(c, dy, dt);
  Tensor dx = c.zeros({R, H}), dw = c.zeros({H}), dxl = Tensor::empty({R, H}, dt, *c.alloc);
  Tensor dwl = Tensor::zeros({H}, dt, *c.alloc);
  kernels::rmsnorm_backward(dx, dw, dy, x, r1, w, c.ctx);
  kernels::rmsnorm_backward(dxl, dwl, dyl, xl, r2, wl, c.ctx);
  expect_close(c, dxl, dx, dt, "rmsnorm dx");
  expect_close(c, dwl, dw, dt, "rmsnorm dw", 1e-2);

  auto table = kernels::make_rope_table(8, 16, 10000.0, std::nullopt);
  Tensor q = c.randn({6, 16}, 1, 4), ql = to_dtype(c, q, dt);
  kernels::rope_forward(q, 0, 16, 2, 8, 3, table, c.ctx);
  kernels::rope_forward(ql, 0, 16, 2, 8, 3, table, c.ctx);
  expect_close(c, ql, q, dt, "rope");

  Tensor gu = c.randn({5, 2 * 12}, 1, 5), gul = to_dtype(c, gu, dt);
  Tensor h = c.zeros({5, 12}), hl = Tensor::empty({5, 12}, dt, *c.alloc);
  kernels::swiglu_forward(h, gu, c.ctx);
  kernels::swiglu_forward(hl, gul, c.ctx);
  expect_close(c, hl, h, dt, "swiglu");
  Tensor dh = c.randn({5, 12}, 1, 6), dhl = to_dtype(c, dh, dt);
  Tensor dgu = c.zeros({5, 24}), dgul = Tensor::empty({5, 24}, dt, *c.alloc);
  kernels::swiglu_backward(dgu, dh, gu, c.ctx);
  kernels::swiglu_backward(dgul, dhl, gul, c.ctx);
  expect_close(c, dgul, dgu, dt, "swiglu backward");

  Tensor tab = c.randn({10, 8}, 1, 7), tabl = to_dtype(c, tab, dt);
  Tensor ids = c.ids({3, 1, 3, 9});
  Tensor e = c.zeros({4, 8}), el = Tensor::empty({4, 8}, dt, *c.alloc);
  kernels::embedding_forward(e, ids, tab, c.ctx);
  kernels::embedding_forward(el, ids, tabl, c.ctx);
  expect_close(c, el, e, dt, "embedding");
  Tensor ge = c.randn({4, 8}, 1, 8), gel = to_dtype(c, ge, dt);
  Tensor dt32 = c.zeros({10, 8}), dtl = Tensor::zeros({10, 8}, dt, *c.alloc);
  kernels::embedding_backward(dt32, ge, ids, c.ctx);
  kernels::embedding_backward(dtl, gel, ids, c.ctx);
  expect_close(c, dtl, dt32, dt, "embedding backward");

  Tensor a = c.randn({5000}, 1, 9), b = c.randn({5000}, 1, 10);
  Tensor al = to_dtype(c, a, dt), bl = to_dtype(c, b, dt);
  kernels::add_(a, b, c.ctx);
  kernels::add_(al, bl, c.ctx);
  expect_close(c, al, a, dt, "add");
}

TEST_P(LowPrecision, AttentionAndLoss) {
  const DType dt = GetParam();
  Cpu c;
  const kernels::AttentionShape s{2, 70, 4, 2, 8};
  const float scale = 1.0f / std::sqrt(8.0f);
  Tensor qkv = c.randn({s.batch * s.seq, s.qkv_width()}, 1, 1), qkvl = to_dtype(c, qkv, dt);
  Tensor out = c.zeros({s.batch * s.seq, s.out_width()}), probs = c.zeros({s.batch, 4, s.seq, s.seq});
  Tensor outl = Tensor::empty(out.shape(), dt, *c.alloc), probsl = Tensor::empty(probs.shape(), dt, *c.alloc);
  kernels::attention_eager_forward(out, probs, qkv, s, scale, c.ctx);
  kernels::attention_eager_forward(outl, probsl, qkvl, s, scale, c.ctx);
  expect_close(c, outl, out, dt, "attention out", 2e-3);
  expect_close(c, probsl, probs, dt, "attention probs");
  Tensor dout = c.randn(out.shape(), 1, 2), doutl = to_dtype(c, dout, dt);
  Tensor dqkv = c.zeros(qkv.shape()), dqkvl = Tensor::empty(qkv.shape(), dt, *c.alloc);
  kernels::attention_eager_backward(dqkv, dout, probs, qkv, s, scale, c.ctx);
  kernels::attention_eager_backward(dqkvl, doutl, probsl, qkvl, s, scale, c.ctx);
  expect_close(c, dqkvl, dqkv, dt, "attention dqkv", 2e-2);

  // Flash attention on low-precision tensors against fp32 flash on the same rounded inputs.
  Tensor lse = c.zeros({s.batch, 4, s.seq}), lsel = c.zeros({s.batch, 4, s.seq});
  Tensor fo = c.zeros(out.shape()), fol = Tensor::empty(out.shape(), dt, *c.alloc);
  kernels::attention_flash_forward(fo, lse, qkv, s, scale, c.ctx);
  kernels::attention_flash_forward(fol, lsel, qkvl, s, scale, c.ctx);
  expect_close(c, fol, fo, dt, "flash out", 2e-3);
  for (std::int64_t i = 0; i < lse.numel(); ++i) ASSERT_NEAR(lsel.f32()[i], lse.f32()[i], 1e-4) << i;
  Tensor fd = c.zeros(qkv.shape()), fdl = Tensor::empty(qkv.shape(), dt, *c.alloc);
  kernels::attention_flash_backward(fd, dout, fo, lse, qkv, s, scale, c.ctx);
  kernels::attention_flash_backward(fdl, doutl, fol, lsel, qkvl, s, scale, c.ctx);
  expect_close(c, fdl, fd, dt, "flash dqkv", 2e-2);

  Tensor logits = c.randn({6, 50}, 2, 3), logitsl = to_dtype(c, logits, dt);
  Tensor tg = c.ids({1, 49, kernels::kIgnoreIndex, 0, 7, 7});
  Tensor l1 = c.zeros({6}), l2 = c.zeros({6});
  const auto a = kernels::cross_entropy_forward(l1, logits, tg, c.ctx);
  const auto b = kernels::cross_entropy_forward(l2, logitsl, tg, c.ctx);
  EXPECT_NEAR(a.sum, b.sum, 1e-4);  // same rounded inputs, fp32 compute
  kernels::cross_entropy_backward(logits, logits, l1, tg, 0.2f, c.ctx);
  kernels::cross_entropy_backward(logitsl, logitsl, l2, tg, 0.2f, c.ctx);
  expect_close(c, logitsl, logits, dt, "dlogits", 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LowPrecision, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(StochasticRounding, IsUnbiasedAndBracketsTheValue) {
  const float x = 1.0f + 0x1p-9f;  // a quarter of the way from 1 to the next bf16 (1 + 2^-7)
  const float lo = 1.0f, hi = 1.0f + 0x1p-7f;
  int ups = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const float r = bf16_to_float(kernels::stochastic_round_bf16(x, kernels::rounding_bits(7, 1, i)));
    ASSERT_TRUE(r == lo || r == hi) << r;
    ups += r == hi;
  }
  EXPECT_NEAR(static_cast<double>(ups) / n, 0.25, 0.02);
  // Exactly representable values never move.
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(bf16_to_float(kernels::stochastic_round_bf16(hi, kernels::rounding_bits(7, 2, i))), hi);
}

TEST(AdamW, Bf16ParamsWithFp32OrBf16States) {
  Cpu c;
  const std::int64_t n = 4096;
  Tensor p = c.randn({n}, 1, 1), g = c.randn({n}, 1, 2);
  Tensor pl = to_dtype(c, p, DType::kBF16), gl = to_dtype(c, g, DType::kBF16);
  Tensor m = c.zeros({n}), v = c.zeros({n});
  Tensor m32 = c.zeros({n}), v32 = c.zeros({n});
  Tensor ml = Tensor::zeros({n}, DType::kBF16, *c.alloc), vl = Tensor::zeros({n}, DType::kBF16, *c.alloc);
  Tensor pl2 = Tensor::empty({n}, DType::kBF16, *c.alloc);
  pl2.copy_from(pl);
  kernels::AdamWHyper hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.rounding_seed = 3;
  const std::vector<kernels::ElementRange> all = {{0, n, true}};
  kernels::adamw_update(p, m, v, g, all, hp, c.ctx);          // fp32 reference
  kernels::adamw_update(pl, m32, v32, gl, all, hp, c.ctx);    // bf16 params, fp32 states
  kernels::adamw_update(pl2, ml, vl, gl, all, hp, c.ctx);     // bf16 params and states
  Tensor a = as_f32(c, pl), b = as_f32(c, pl2);
  double bias = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(a.f32()[i], p.f32()[i], 1e-2 * std::fabs(p.f32()[i]) + 1e-3) << i;
    ASSERT_NEAR(b.f32()[i], p.f32()[i], 2e-2 * std::fabs(p.f32()[i]) + 1e-3) << i;
    bias += a.f32()[i] - p.f32()[i];
  }
  EXPECT_LT(std::fabs(bias / n), 2e-4);  // stochastic rounding: no systematic drift
}

}  // namespace
}  // namespace scalelab

#include "kernels/fused.h"
#include "kernels/layernorm.h"

namespace scalelab {
namespace {

class LowPrecisionFused : public ::testing::TestWithParam<DType> {};

TEST_P(LowPrecisionFused, NormsActivationsAndLinearCrossEntropy) {
  const DType dt = GetParam();
  Cpu c;
  const std::int64_t R = 11, H = 24;
  Tensor x = c.randn({R, H}, 1, 1), d = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3), b = c.randn({H}, 1, 4);
  Tensor xl = to_dtype(c, x, dt), dl = to_dtype(c, d, dt), wl = to_dtype(c, w, dt), bl = to_dtype(c, b, dt);
  // RMSNorm + residual.
  Tensor h = c.zeros({R, H}), y = c.zeros({R, H}), r = c.zeros({R});
  Tensor hl = Tensor::empty({R, H}, dt, *c.alloc), yl = Tensor::empty({R, H}, dt, *c.alloc), rl = c.zeros({R});
  kernels::rmsnorm_residual_forward(h, y, r, x, d, w, 1e-5f, c.ctx);
  kernels::rmsnorm_residual_forward(hl, yl, rl, xl, dl, wl, 1e-5f, c.ctx);
  expect_close(c, hl, h, dt, "rms residual h");
  expect_close(c, yl, y, dt, "rms residual y");
  Tensor y2 = Tensor::empty({R, H}, dt, *c.alloc);
  kernels::rmsnorm_recompute(y2, hl, rl, wl, c.ctx);
  for (std::int64_t i = 0; i < R * H; ++i) ASSERT_EQ(static_cast<bf16*>(y2.raw())[i].bits, static_cast<bf16*>(yl.raw())[i].bits);
  Tensor dy = c.randn({R, H}, 1, 5), dyl = to_dtype(c, dy, dt);
  Tensor dh = c.randn({R, H}, 1, 6), dhl = to_dtype(c, dh, dt), dw = c.zeros({H}), dwl = Tensor::zeros({H}, dt, *c.alloc);
  kernels::rmsnorm_residual_backward(dh, dw, dy, h, r, w, c.ctx);
  kernels::rmsnorm_residual_backward(dhl, dwl, dyl, hl, rl, wl, c.ctx);
  expect_close(c, dhl, dh, dt, "rms residual dh", 2e-2);
  expect_close(c, dwl, dw, dt, "rms residual dw", 2e-2);
  // LayerNorm + residual (affine) and its backward.
  Tensor m1 = c.zeros({R}), s1 = c.zeros({R}), m2 = c.zeros({R}), s2 = c.zeros({R});
  kernels::layernorm_residual_forward(h, y, m1, s1, x, d, w, b, 1e-5f, c.ctx);
  kernels::layernorm_residual_forward(hl, yl, m2, s2, xl, dl, wl, bl, 1e-5f, c.ctx);
  expect_close(c, yl, y, dt, "layernorm residual y", 2e-2);
  Tensor gx = c.zeros({R, H}), gxl = Tensor::empty({R, H}, dt, *c.alloc);
  Tensor gw = c.zeros({H}), gb = c.zeros({H}), gwl = Tensor::zeros({H}, dt, *c.alloc), gbl = Tensor::zeros({H}, dt, *c.alloc);
  kernels::layernorm_backward(gx, &gw, &gb, dy, h, m1, s1, w, c.ctx);
  kernels::layernorm_backward(gxl, &gwl, &gbl, dyl, hl, m2, s2, wl, c.ctx);
  expect_close(c, gxl, gx, dt, "layernorm dx", 5e-2);
  expect_close(c, gbl, gb, dt, "layernorm db", 2e-2);
  // SwiGLU + down projection backward with recompute.
  const std::int64_t T = 7, I = 10, D = 6;
  Tensor gu = c.randn({T, 2 * I}, 1, 7), wd = c.randn({D, I}, 0.3f, 8), dout = c.randn({T, D}, 1, 9);
  Tensor gul = to_dtype(c, gu, dt), wdl = to_dtype(c, wd, dt), doutl = to_dtype(c, dout, dt);
  Tensor dgu = c.zeros({T, 2 * I}), dwd = c.zeros({D, I}), dgul = Tensor::empty({T, 2 * I}, dt, *c.alloc);
  Tensor dwdl = c.zeros({D, I});
  kernels::swiglu_down_backward_recompute(dgu, dwd, dout, gu, wd, c.ctx);
  kernels::swiglu_down_backward_recompute(dgul, dwdl, doutl, gul, wdl, c.ctx);
  expect_close(c, dgul, dgu, dt, "swiglu recompute dgu", 2e-2);
  expect_close(c, dwdl, dwd, dt, "swiglu recompute dwdown", 2e-2);
  // Bias + ReLU.
  Tensor u = c.randn({T, I}, 1, 10), ub = c.randn({I}, 1, 11), ul = to_dtype(c, u, dt), ubl = to_dtype(c, ub, dt);
  Tensor ry = c.zeros({T, I}), ryl = Tensor::empty({T, I}, dt, *c.alloc);
  kernels::bias_relu_forward(ry, u, ub, c.ctx);
  kernels::bias_relu_forward(ryl, ul, ubl, c.ctx);
  expect_close(c, ryl, ry, dt, "bias relu");
  // Linear + cross-entropy (bf16 input and weight; fp32 and low-precision weight gradients).
  const std::int64_t N = 37, K = 16, V = 45;
  Tensor lx = c.randn({N, K}, 1, 12), lw = c.randn({V, K}, 0.5f, 13), lxl = to_dtype(c, lx, dt), lwl = to_dtype(c, lw, dt);
  std::vector<std::int32_t> tv;
  for (std::int64_t i = 0; i < N; ++i) tv.push_back(i % 5 == 3 ? kernels::kIgnoreIndex : static_cast<std::int32_t>((i * 7) % V));
  Tensor tg = c.ids(tv);
  const float scale = 1.0f / static_cast<float>(kernels::count_target_tokens(tg));
  Tensor ldx = c.zeros({N, K}), ldw = c.zeros({V, K}), ldxl = Tensor::empty({N, K}, dt, *c.alloc), ldw32 = c.zeros({V, K});
  const auto a = kernels::fused_linear_cross_entropy(ldx, ldw, lx, lw, tg, scale, 8, c.ctx);
  const auto bsum = kernels::fused_linear_cross_entropy(ldxl, ldw32, lxl, lwl, tg, scale, 8, c.ctx);
  EXPECT_EQ(a.count, bsum.count);
  EXPECT_NEAR(a.sum, bsum.sum, 1e-4 * std::fabs(a.sum));
  expect_close(c, ldxl, ldx, dt, "fused CE dx", 1e-3);
  for (std::int64_t i = 0; i < V * K; ++i) ASSERT_NEAR(ldw32.f32()[i], ldw.f32()[i], 1e-4) << i;
  const auto f = kernels::fused_linear_cross_entropy_forward(lxl, lwl, tg, 8, c.ctx);
  EXPECT_NEAR(f.sum, a.sum, 1e-4 * std::fabs(a.sum));
  // The low-precision path never holds [N, V] logits: its blocks are one chunk.
  const auto blocks = kernels::fused_linear_cross_entropy_workspace_blocks(N, 8, K, V, dt, dt, dt, DType::kF32, true);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0], 8u * V * 4);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LowPrecisionFused, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace scalelab
