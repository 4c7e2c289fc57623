// The backend seam (kernels/backend.h): which ops each device implements, how the fronts refuse
// tensors they cannot run, the composed fallbacks of the fused ops against the CPU's fused
// kernels (fp32: within 1e-5 relative), and the meta backend's allocations against the CPU's.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "core/device.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/cpu/backend.h"
#include "kernels/elementwise.h"
#include "kernels/fused.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "test_util.h"

namespace scalelab {
namespace {

using kernels::kIgnoreIndex;
using test::clone;
using test::Cpu;
using test::expect_close;

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

TEST(Backend, AllOpsAreDistinctAndEveryBuiltBackendListsThem) {
  const auto& ops = kernels::all_ops();
  EXPECT_EQ(ops.size(), 49u);  // 45 + the qat family's 4
  EXPECT_EQ(std::set<std::string>(ops.begin(), ops.end()).size(), ops.size());
  for (const auto& op : ops) {
    EXPECT_TRUE(kernels::supports(op, DeviceType::kCPU)) << op;
    EXPECT_TRUE(kernels::supports(op, DeviceType::kMeta)) << op;
  }
  EXPECT_FALSE(kernels::supports("no_such_op", DeviceType::kCPU));
  EXPECT_FALSE(kernels::supports("no_such_op", DeviceType::kMeta));
}

TEST(Backend, AbsentCudaSupportsNothing) {
  if (device_available(DeviceType::kCUDA)) GTEST_SKIP() << "a GPU is present";
  for (const auto& op : kernels::all_ops()) EXPECT_FALSE(kernels::supports(op, DeviceType::kCUDA)) << op;
}

TEST(Backend, BackendForNamesTheDevice) {
  EXPECT_EQ(kernels::backend_for(DeviceType::kCPU, "x").device(), DeviceType::kCPU);
  EXPECT_EQ(kernels::backend_for(DeviceType::kMeta, "x").device(), DeviceType::kMeta);
}

// Host memory dressed as a CUDA tensor: never read, the fronts refuse it before any kernel runs.
Tensor fake_cuda(std::vector<float>& host, const Shape& shape) {
  host.resize(static_cast<std::size_t>(shape.numel()));
  return Tensor::from_external(host.data(), shape, DType::kF32, DeviceType::kCUDA);
}

TEST(Backend, MixedDevicesAreRefusedNamingBoth) {
  Cpu c;
  std::vector<float> hb;
  Tensor a = c.zeros({4, 3}), b = fake_cuda(hb, {4, 3}), out = c.zeros({4, 3});
  try {
    kernels::add(out, a, b, c.ctx);
    FAIL() << "expected a refusal";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("[add] tensors on different devices: cpu and cuda"), std::string::npos)
        << e.what();
  }
}

TEST(Backend, DeviceWithoutBackendIsRefusedNamingTheOp) {
  if (device_available(DeviceType::kCUDA)) GTEST_SKIP() << "a GPU is present";
  Cpu c;
  std::vector<float> hx, hy, hw, hr;
  Tensor x = fake_cuda(hx, {4, 8}), y = fake_cuda(hy, {4, 8}), w = fake_cuda(hw, {8}), rstd = fake_cuda(hr, {4});
  auto expect_refusal = [](const char* op, const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << op << ": expected BackendUnavailable";
    } catch (const kernels::BackendUnavailable& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("[") + op + "]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    }
  };
  expect_refusal("rmsnorm_forward", [&] { kernels::rmsnorm_forward(y, rstd, x, w, 1e-5f, c.ctx); });
  expect_refusal("add_", [&] { kernels::add_(y, x, c.ctx); });
  expect_refusal("sum_of_squares", [&] { kernels::sum_of_squares(x, c.ctx); });
  std::vector<float> hw2, hy2;
  Tensor w2 = fake_cuda(hw2, {5, 8}), y2 = fake_cuda(hy2, {4, 5});
  expect_refusal("linear_forward", [&] { kernels::linear_forward(y2, x, w2, nullptr, c.ctx); });
  std::vector<std::int32_t> ids(4, 0);
  Tensor targets = Tensor::from_external(ids.data(), {4}, DType::kI32, DeviceType::kCUDA);
  expect_refusal("count_target_tokens", [&] { kernels::count_target_tokens(targets); });
}

// ---------------------------------------------------------------------------------------------
// Composed fallbacks of the fused ops == the CPU's fused kernels
// ---------------------------------------------------------------------------------------------

// The CPU's basic ops with Backend's default (composed) fused ops.
class ComposedCpu final : public kernels::Backend {
 public:
  DeviceType device() const override { return DeviceType::kCPU; }
  std::vector<std::string> ops() const override { return {}; }

  void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) override {
    cpu_.linear_forward(y, x, w, bias, ctx);
  }
  void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w,
                       ExecContext& ctx, bool acc) override {
    cpu_.linear_backward(dx, dw, dbias, dy, x, w, ctx, acc);
  }
  void gemm_ex(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, DType at,
               std::int64_t lda, const void* b, DType bt, std::int64_t ldb, float beta, void* c, DType ct,
               std::int64_t ldc, ExecContext& ctx) override {
    cpu_.gemm_ex(ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, ctx);
  }
  void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps,
                       ExecContext& ctx) override {
    cpu_.rmsnorm_forward(y, rstd, x, w, eps, ctx);
  }
  void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w,
                        ExecContext& ctx, bool acc) override {
    cpu_.rmsnorm_backward(dx, dw, dy, x, rstd, w, ctx, acc);
  }
  void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                         float eps, ExecContext& ctx) override {
    cpu_.layernorm_forward(y, mean, rstd, x, w, b, eps, ctx);
  }
  void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                          const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool acc) override {
    cpu_.layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, ctx, acc);
  }
  void add_(Tensor& a, const Tensor& b, ExecContext& ctx) override { cpu_.add_(a, b, ctx); }
  void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx) override { cpu_.add(out, a, b, ctx); }
  void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) override { cpu_.swiglu_forward(h, gu, ctx); }
  void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) override {
    cpu_.swiglu_backward(dgu, dh, gu, ctx);
  }
  void activation_forward(Tensor& y, const Tensor& x, kernels::Activation act, ExecContext& ctx) override {
    cpu_.activation_forward(y, x, act, ctx);
  }
  void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, kernels::Activation act,
                           ExecContext& ctx) override {
    cpu_.activation_backward(dx, dy, x, act, ctx);
  }
  void bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx) override { cpu_.bias_add_(y, b, ctx); }
  void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) override {
    cpu_.embedding_forward(y, ids, table, ctx);
  }
  void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx,
                          std::int64_t skip_id) override {
    cpu_.embedding_backward(dtable, dy, ids, ctx, skip_id);
  }
  void position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                      ExecContext& ctx) override {
    cpu_.position_embedding_add_forward(y, table, seq, offset, ctx);
  }
  void position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                   ExecContext& ctx) override {
    cpu_.position_embedding_backward(dtable, dy, seq, offset, ctx);
  }
  void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t nh, std::int64_t hd, std::int64_t seq,
                    const kernels::RopeTable& t, ExecContext& ctx) override {
    cpu_.rope_forward(x, col, ld, nh, hd, seq, t, ctx);
  }
  void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t nh, std::int64_t hd,
                     std::int64_t seq, const kernels::RopeTable& t, ExecContext& ctx) override {
    cpu_.rope_backward(dx, col, ld, nh, hd, seq, t, ctx);
  }
  void dropout_forward(Tensor& x, float p, const kernels::DropoutKey& key, ExecContext& ctx) override {
    cpu_.dropout_forward(x, p, key, ctx);
  }
  void dropout_backward(Tensor& dx, const Tensor& dy, float p, const kernels::DropoutKey& key,
                        ExecContext& ctx) override {
    cpu_.dropout_backward(dx, dy, p, key, ctx);
  }
  void fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext& ctx) override {
    cpu_.fake_quant_per_token_forward(y, x, ctx);
  }
  void fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool acc,
                                     ExecContext& ctx) override {
    cpu_.fake_quant_per_token_backward(dx, dy, x, acc, ctx);
  }
  void fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext& ctx) override {
    cpu_.fake_quant_group_forward(wq, w, group, ctx);
  }
  void fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                 ExecContext& ctx) override {
    cpu_.fake_quant_group_backward(dw, g, w, group, ctx);
  }
  void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const kernels::AttentionShape& s,
                               float scale, ExecContext& ctx) override {
    cpu_.attention_eager_forward(out, probs, qkv, s, scale, ctx);
  }
  void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                const kernels::AttentionShape& s, float scale, ExecContext& ctx) override {
    cpu_.attention_eager_backward(dqkv, dout, probs, qkv, s, scale, ctx);
  }
  void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const kernels::AttentionShape& s,
                               float scale, ExecContext& ctx) override {
    cpu_.attention_flash_forward(out, lse, qkv, s, scale, ctx);
  }
  void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                const Tensor& qkv, const kernels::AttentionShape& s, float scale,
                                ExecContext& ctx) override {
    cpu_.attention_flash_backward(dqkv, dout, out, lse, qkv, s, scale, ctx);
  }
  kernels::LossSum cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets,
                                         ExecContext& ctx) override {
    return cpu_.cross_entropy_forward(lse, logits, targets, ctx);
  }
  void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              float grad_scale, ExecContext& ctx) override {
    cpu_.cross_entropy_backward(dlogits, logits, lse, targets, grad_scale, ctx);
  }
  std::int64_t count_target_tokens(const Tensor& targets, ExecContext& ctx) override {
    return cpu_.count_target_tokens(targets, ctx);
  }
  void adamw_update(Tensor& p, Tensor& m, Tensor& v, const Tensor& g, const std::vector<kernels::ElementRange>& r,
                    const kernels::AdamWHyper& h, ExecContext& ctx) override {
    cpu_.adamw_update(p, m, v, g, r, h, ctx);
  }
  double sum_of_squares(const Tensor& g, ExecContext& ctx) override { return cpu_.sum_of_squares(g, ctx); }
  bool has_non_finite(const Tensor& g, ExecContext& ctx) override { return cpu_.has_non_finite(g, ctx); }
  void scale_(Tensor& g, float factor, ExecContext& ctx) override { cpu_.scale_(g, factor, ctx); }

 private:
  kernels::cpu::CpuBackend cpu_;
};

struct Pair {
  kernels::cpu::CpuBackend fused;
  ComposedCpu composed;
};

TEST(ComposedFallback, RMSNormResidualForwardBackwardRecompute) {
  Cpu c;
  Pair p;
  const std::int64_t R = 13, H = 19;
  Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2), w = c.randn({H}, 1, 3);
  Tensor h1 = c.zeros({R, H}), y1 = c.zeros({R, H}), r1 = c.zeros({R});
  Tensor h2 = c.zeros({R, H}), y2 = c.zeros({R, H}), r2 = c.zeros({R});
  p.fused.rmsnorm_residual_forward(h1, y1, r1, x, delta, w, 1e-5f, c.ctx);
  p.composed.rmsnorm_residual_forward(h2, y2, r2, x, delta, w, 1e-5f, c.ctx);
  expect_close(h2, h1, "h");
  expect_close(y2, y1, "y");
  expect_close(r2, r1, "rstd");

  Tensor dy = c.randn({R, H}, 1, 4), dh0 = c.randn({R, H}, 1, 5), dw0 = c.randn({H}, 1, 6);
  Tensor dh1 = clone(c, dh0), dh2 = clone(c, dh0), dw1 = clone(c, dw0), dw2 = clone(c, dw0);
  p.fused.rmsnorm_residual_backward(dh1, dw1, dy, h1, r1, w, c.ctx);
  p.composed.rmsnorm_residual_backward(dh2, dw2, dy, h1, r1, w, c.ctx);
  expect_close(dh2, dh1, "dh");
  expect_close(dw2, dw1, "dw");

  Tensor yr1 = c.zeros({R, H}), yr2 = c.zeros({R, H});
  p.fused.rmsnorm_recompute(yr1, h1, r1, w, c.ctx);
  p.composed.rmsnorm_recompute(yr2, h1, r1, w, c.ctx);
  expect_close(yr2, yr1, "recomputed y");
}

TEST(ComposedFallback, LayerNormResidualForwardBackwardRecompute) {
  for (bool affine : {true, false}) {
    SCOPED_TRACE(affine ? "affine" : "no affine");
    Cpu c;
    Pair p;
    const std::int64_t R = 11, H = 21;
    Tensor x = c.randn({R, H}, 1, 1), delta = c.randn({R, H}, 1, 2);
    Tensor w = affine ? c.randn({H}, 1, 3) : Tensor(), b = affine ? c.randn({H}, 1, 4) : Tensor();
    Tensor h1 = c.zeros({R, H}), y1 = c.zeros({R, H}), m1 = c.zeros({R}), r1 = c.zeros({R});
    Tensor h2 = c.zeros({R, H}), y2 = c.zeros({R, H}), m2 = c.zeros({R}), r2 = c.zeros({R});
    p.fused.layernorm_residual_forward(h1, y1, m1, r1, x, delta, w, b, 1e-5f, c.ctx);
    p.composed.layernorm_residual_forward(h2, y2, m2, r2, x, delta, w, b, 1e-5f, c.ctx);
    expect_close(h2, h1, "h");
    expect_close(y2, y1, "y");
    expect_close(m2, m1, "mean");
    expect_close(r2, r1, "rstd");

    Tensor dy = c.randn({R, H}, 1, 5), dh0 = c.randn({R, H}, 1, 6);
    Tensor dh1 = clone(c, dh0), dh2 = clone(c, dh0);
    Tensor dw1 = c.zeros({H}), dw2 = c.zeros({H}), db1 = c.zeros({H}), db2 = c.zeros({H});
    p.fused.layernorm_residual_backward(dh1, affine ? &dw1 : nullptr, affine ? &db1 : nullptr, dy, h1, m1, r1, w,
                                        c.ctx);
    p.composed.layernorm_residual_backward(dh2, affine ? &dw2 : nullptr, affine ? &db2 : nullptr, dy, h1, m1, r1, w,
                                           c.ctx);
    expect_close(dh2, dh1, "dh");
    expect_close(dw2, dw1, "dw");
    expect_close(db2, db1, "db");

    Tensor yr1 = c.zeros({R, H}), yr2 = c.zeros({R, H});
    p.fused.layernorm_recompute(yr1, h1, m1, r1, w, b, c.ctx);
    p.composed.layernorm_recompute(yr2, h1, m1, r1, w, b, c.ctx);
    expect_close(yr2, yr1, "recomputed y");
  }
}

TEST(ComposedFallback, SwiGLUBackwardRecomputeWithAndWithoutAliasing) {
  Cpu c;
  Pair p;
  const std::int64_t T = 9, I = 13;
  Tensor gu = c.randn({T, 2 * I}, 1, 1), dh = c.randn({T, I}, 1, 2);
  Tensor dgu1 = c.zeros({T, 2 * I}), act1 = c.zeros({T, I}), dgu2 = c.zeros({T, 2 * I}), act2 = c.zeros({T, I});
  p.fused.swiglu_backward_recompute(dgu1, act1, dh, gu, c.ctx);
  p.composed.swiglu_backward_recompute(dgu2, act2, dh, gu, c.ctx);
  expect_close(dgu2, dgu1, "dgu");
  expect_close(act2, act1, "act");
  // act over dh, dgu over gu, as the fused MLP calls it.
  Tensor g2 = clone(c, gu), d2 = clone(c, dh);
  p.composed.swiglu_backward_recompute(g2, d2, d2, g2, c.ctx);
  expect_close(g2, dgu1, "dgu (aliased)");
  expect_close(d2, act1, "act (aliased)");
}

TEST(ComposedFallback, SwiGLUDownBackwardRecompute) {
  Cpu c;
  Pair p;
  const std::int64_t T = 10, I = 12, H = 7;
  Tensor gu = c.randn({T, 2 * I}, 1, 1), dout = c.randn({T, H}, 1, 2), wdown = c.randn({H, I}, 0.3f, 3);
  Tensor dw0 = c.randn({H, I}, 1, 4), dw1 = clone(c, dw0), dw2 = clone(c, dw0);
  Tensor dgu1 = c.zeros({T, 2 * I}), dgu2 = c.zeros({T, 2 * I});
  p.fused.swiglu_down_backward_recompute(dgu1, dw1, dout, gu, wdown, c.ctx);
  p.composed.swiglu_down_backward_recompute(dgu2, dw2, dout, gu, wdown, c.ctx);
  expect_close(dgu2, dgu1, "dgu");
  expect_close(dw2, dw1, "dwdown");
  // dgu over gu, as the fused MLP calls it.
  Tensor g3 = clone(c, gu), dw3 = clone(c, dw0);
  p.composed.swiglu_down_backward_recompute(g3, dw3, dout, g3, wdown, c.ctx);
  expect_close(g3, dgu1, "dgu (aliased)");
  expect_close(dw3, dw1, "dwdown (aliased)");
}

TEST(ComposedFallback, BiasReLUForwardBackward) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    Cpu c;
    Pair p;
    const std::int64_t R = 8, F = 17;
    Tensor x = c.randn({R, F}, 1, 1), b = bias ? c.randn({F}, 1, 2) : Tensor();
    Tensor y1 = c.zeros({R, F}), y2 = clone(c, x);  // the composed one in place (y aliases x)
    p.fused.bias_relu_forward(y1, x, b, c.ctx);
    p.composed.bias_relu_forward(y2, y2, b, c.ctx);
    expect_close(y2, y1, "y");

    Tensor dy = c.randn({R, F}, 1, 3), db0 = c.randn({F}, 1, 4);
    Tensor dx1 = c.zeros({R, F}), dx2 = clone(c, dy), db1 = clone(c, db0), db2 = clone(c, db0);
    p.fused.bias_relu_backward(dx1, bias ? &db1 : nullptr, dy, y1, c.ctx);
    p.composed.bias_relu_backward(dx2, bias ? &db2 : nullptr, dx2, y1, c.ctx);  // dx aliases dy
    expect_close(dx2, dx1, "dx");
    expect_close(db2, db1, "db");
  }
}

TEST(ComposedFallback, LinearCrossEntropyOverChunks) {
  Cpu c;
  Pair p;
  const std::int64_t T = 11, H = 6, V = 23, chunk = 4;
  Tensor x = c.randn({T, H}, 1, 1), w = c.randn({V, H}, 0.5f, 2);
  Tensor targets = c.ids({3, kIgnoreIndex, 0, 22, 5, 5, kIgnoreIndex, 17, 1, 9, 2});
  Tensor dw0 = c.randn({V, H}, 1, 3), dw1 = clone(c, dw0), dw2 = clone(c, dw0);
  Tensor dx1 = c.zeros({T, H}), dx2 = c.zeros({T, H});
  const float scale = 1.0f / 9;
  const auto l1 = p.fused.fused_linear_cross_entropy(dx1, dw1, x, w, targets, scale, chunk, c.ctx);
  const auto l2 = p.composed.fused_linear_cross_entropy(dx2, dw2, x, w, targets, scale, chunk, c.ctx);
  EXPECT_EQ(l2.count, l1.count);
  EXPECT_NEAR(l2.sum, l1.sum, 1e-5 * std::fabs(l1.sum));
  expect_close(dx2, dx1, "dx");
  expect_close(dw2, dw1, "dw");

  const auto f1 = p.fused.fused_linear_cross_entropy_forward(x, w, targets, chunk, c.ctx);
  const auto f2 = p.composed.fused_linear_cross_entropy_forward(x, w, targets, chunk, c.ctx);
  EXPECT_EQ(f2.count, f1.count);
  EXPECT_NEAR(f2.sum, f1.sum, 1e-5 * std::fabs(f1.sum));
  EXPECT_NEAR(f1.sum, l1.sum, 1e-5 * std::fabs(l1.sum));
}

// ---------------------------------------------------------------------------------------------
// The meta backend allocates what the CPU kernels allocate
// ---------------------------------------------------------------------------------------------

// One allocator and context per device; tensors made before tracing starts.
struct Dev {
  explicit Dev(DeviceType d)
      : alloc(std::make_unique<DeviceAllocator>(d == DeviceType::kMeta ? make_meta_backend() : make_host_backend(),
                                                std::size_t{1} << 34)),
        ctx{alloc.get(), nullptr} {}
  // Random values in [-1, 1) on the CPU; uninitialized on meta.
  Tensor rand(const Shape& s, DType dt, std::uint32_t seed) {
    Tensor t = Tensor::empty(s, dt, *alloc);
    if (alloc->device() != DeviceType::kCPU) return t;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> host(static_cast<std::size_t>(t.numel()));
    for (float& v : host) v = u(rng);
    Tensor f = Tensor::from_external(host.data(), s, DType::kF32);
    t.copy_from(f);
    return t;
  }
  Tensor targets(std::int64_t n, std::int64_t vocab) {
    Tensor t = Tensor::empty({n}, DType::kI32, *alloc);
    if (alloc->device() != DeviceType::kCPU) return t;
    for (std::int64_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = i % 5 == 3 ? kIgnoreIndex : (i * 7) % vocab;
    return t;
  }
  std::unique_ptr<DeviceAllocator> alloc;
  ExecContext ctx;
};

// Builds the tensors with `make` on a CPU and on a meta device, then runs `run` on each with the
// allocator traced; the traces must agree event by event (and hold at least `min_allocs` allocations).
template <class State>
void expect_same_allocations(const std::function<State(Dev&)>& make, const std::function<void(Dev&, State&)>& run,
                             const char* what, std::size_t min_allocs) {
  std::vector<AllocEvent> traces[2];
  int i = 0;
  for (DeviceType d : {DeviceType::kCPU, DeviceType::kMeta}) {
    Dev dev(d);
    State st = make(dev);
    dev.alloc->set_trace(&traces[i]);
    run(dev, st);
    dev.alloc->set_trace(nullptr);
    ++i;
  }
  ASSERT_EQ(traces[1].size(), traces[0].size()) << what;
  std::size_t allocs = 0;
  for (std::size_t k = 0; k < traces[0].size(); ++k) {
    EXPECT_EQ(traces[1][k].alloc, traces[0][k].alloc) << what << " event " << k;
    EXPECT_EQ(traces[1][k].bytes, traces[0][k].bytes) << what << " event " << k;
    EXPECT_EQ(traces[1][k].what, traces[0][k].what) << what << " event " << k;
    allocs += traces[0][k].alloc;
  }
  EXPECT_GE(allocs, min_allocs) << what;
}

TEST(MetaBackend, GemmAndLinearAllocateAsTheCpu) {
  struct Mats {
    Tensor a, b, c;
  };
  const std::int64_t m = 70, n = 45, k = 33;
  for (const auto& types : {std::tuple{DType::kBF16, DType::kF32, DType::kBF16},
                            std::tuple{DType::kF16, DType::kF16, DType::kF16},
                            std::tuple{DType::kF32, DType::kBF16, DType::kF32},
                            std::tuple{DType::kF32, DType::kF32, DType::kF32}}) {
    // Plain variables, not structured bindings: clang before 16 cannot capture those in a lambda.
    const DType at = std::get<0>(types), bt = std::get<1>(types), ct = std::get<2>(types);
    expect_same_allocations<Mats>(
        [&](Dev& d) { return Mats{d.rand({m, k}, at, 1), d.rand({k, n}, bt, 2), d.rand({m, n}, ct, 3)}; },
        [&](Dev& d, Mats& s) {
          kernels::gemm_ex(false, false, m, n, k, 1.0f, s.a.raw(), at, k, s.b.raw(), bt, n, 0.5f, s.c.raw(), ct, n,
                           d.ctx);
        },
        "gemm_ex",
        static_cast<std::size_t>((at != DType::kF32) + (bt != DType::kF32) + (ct != DType::kF32)));
  }
  struct Lin {
    Tensor x, w, b, y, dy, dx, dw, db;
  };
  expect_same_allocations<Lin>(
      [&](Dev& d) {
        return Lin{d.rand({12, 16}, DType::kBF16, 1), d.rand({24, 16}, DType::kBF16, 2), d.rand({24}, DType::kF32, 3),
                   d.rand({12, 24}, DType::kBF16, 4), d.rand({12, 24}, DType::kBF16, 5),
                   d.rand({12, 16}, DType::kBF16, 6), d.rand({24, 16}, DType::kF32, 7), d.rand({24}, DType::kF32, 8)};
      },
      [&](Dev& d, Lin& s) {
        kernels::linear_forward(s.y, s.x, s.w, &s.b, d.ctx);
        kernels::linear_backward(&s.dx, s.dw, &s.db, s.dy, s.x, s.w, d.ctx);
      },
      "linear", 6);
}

TEST(MetaBackend, AttentionAllocatesAsTheCpu) {
  const kernels::AttentionShape s{2, 40, 4, 2, 8};
  struct Att {
    Tensor qkv, out, probs, lse, dout, dqkv;
  };
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto make = [&](Dev& d) {
      return Att{d.rand({s.batch * s.seq, s.qkv_width()}, dt, 1), d.rand({s.batch * s.seq, s.out_width()}, dt, 2),
                 d.rand({s.batch, s.n_heads, s.seq, s.seq}, dt, 3), d.rand({s.batch, s.n_heads, s.seq}, DType::kF32, 4),
                 d.rand({s.batch * s.seq, s.out_width()}, dt, 5), d.rand({s.batch * s.seq, s.qkv_width()}, dt, 6)};
    };
    expect_same_allocations<Att>(
        make,
        [&](Dev& d, Att& a) {
          kernels::attention_eager_forward(a.out, a.probs, a.qkv, s, 0.3f, d.ctx);
          kernels::attention_eager_backward(a.dqkv, a.dout, a.probs, a.qkv, s, 0.3f, d.ctx);
        },
        "eager attention", dt == DType::kF32 ? 1 : 2);
    expect_same_allocations<Att>(
        make,
        [&](Dev& d, Att& a) {
          kernels::attention_flash_forward(a.out, a.lse, a.qkv, s, 0.3f, d.ctx);
          kernels::attention_flash_backward(a.dqkv, a.dout, a.out, a.lse, a.qkv, s, 0.3f, d.ctx);
        },
        "flash attention", 2);
  }
}

TEST(MetaBackend, FusedLossAndMlpAllocateAsTheCpu) {
  const std::int64_t T = 11, H = 8, V = 37, chunk = 4;
  struct Loss {
    Tensor x, w, targets, dx, dw;
  };
  for (DType dt : {DType::kF32, DType::kBF16}) {
    kernels::LossSum sums[2];
    int which = 0;
    expect_same_allocations<Loss>(
        [&](Dev& d) {
          return Loss{d.rand({T, H}, dt, 1), d.rand({V, H}, dt, 2), d.targets(T, V), d.rand({T, H}, dt, 3),
                      d.rand({V, H}, DType::kF32, 4)};
        },
        [&](Dev& d, Loss& l) {
          sums[which++] = kernels::fused_linear_cross_entropy(l.dx, l.dw, l.x, l.w, l.targets, 0.1f, chunk, d.ctx);
          kernels::fused_linear_cross_entropy_forward(l.x, l.w, l.targets, chunk, d.ctx);
        },
        "fused loss", dt == DType::kF32 ? 2 : 5);
    EXPECT_EQ(sums[1].count, T);  // meta: every target counts
    EXPECT_EQ(sums[1].sum, 0.0);
    EXPECT_LT(sums[0].count, T);
    // A frozen head (dw undefined): no dw GEMM, on the CPU and in the plan alike.
    expect_same_allocations<Loss>(
        [&](Dev& d) { return Loss{d.rand({T, H}, dt, 1), d.rand({V, H}, dt, 2), d.targets(T, V), d.rand({T, H}, dt, 3), Tensor()}; },
        [&](Dev& d, Loss& l) { kernels::fused_linear_cross_entropy(l.dx, l.dw, l.x, l.w, l.targets, 0.1f, chunk, d.ctx); },
        "fused loss, frozen head", dt == DType::kF32 ? 1 : 3);
  }
  struct Mlp {
    Tensor gu, dout, wdown, dgu, dwdown;
  };
  expect_same_allocations<Mlp>(
      [&](Dev& d) {
        return Mlp{d.rand({T, 2 * 12}, DType::kBF16, 1), d.rand({T, H}, DType::kBF16, 2),
                   d.rand({H, 12}, DType::kBF16, 3), d.rand({T, 2 * 12}, DType::kBF16, 4),
                   d.rand({H, 12}, DType::kF32, 5)};
      },
      [&](Dev& d, Mlp& m) { kernels::swiglu_down_backward_recompute(m.dgu, m.dwdown, m.dout, m.gu, m.wdown, d.ctx); },
      "swiglu down backward", 3);
}

TEST(MetaBackend, ValueResultsAreStandIns) {
  Dev d(DeviceType::kMeta);
  Tensor targets = d.targets(9, 5), logits = d.rand({9, 5}, DType::kF32, 1), lse = d.rand({9}, DType::kF32, 2);
  EXPECT_EQ(kernels::count_target_tokens(targets), 9);
  const auto l = kernels::cross_entropy_forward(lse, logits, targets, d.ctx);
  EXPECT_EQ(l.count, 9);
  EXPECT_EQ(l.sum, 0.0);
  EXPECT_EQ(kernels::sum_of_squares(logits, d.ctx), 0.0);
  EXPECT_FALSE(kernels::has_non_finite(logits, d.ctx));
}

}  // namespace
}  // namespace scalelab
