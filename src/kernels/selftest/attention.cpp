// Checks of the attention family (see kernels/selftest.h for how a check works).
//
// Each shape runs eager and flash, forward and backward, on the device against the CPU. The
// backward of the device is fed the CPU's saved tensors (probs, or out and lse) copied to the
// device, so that a backward error is not a forward error carried over. Shapes: grouped-query
// heads (nh = 4 over nkv = 2), a sequence that is no multiple of any tile (S = 100, 77), head dims
// 64 (Llama-3.2-1B, OPT-1.3b), 128 (with one kv head: multi-query) and 32.
//
// Tolerances (‖out − ref‖ / ‖ref‖), compute being fp32 on both sides:
//   fp32  1e-5 (out, probs, lse), 2e-5 (dqkv): the sums over keys and the exp differ in order and
//         implementation (the CPU's AVX2 exp, the GPU's exp2f); the relative error of such fp32
//         sums is ~1e-7·√S-ish, ~3e-7 measured in an emulation of the kernels; the backward's
//         dS = P ⊙ (dP − D) cancels, which loses up to another decade.
//   bf16  1e-2: both sides round the same fp32 values to bf16 (8 bits, 2^-9 relative); they
//         differ only where an fp32 value lies within its tiny difference of a rounding tie, one
//         ulp at those elements — far below 1e-2 in norm; 1e-2 is the family's bf16 budget.
//   fp16  2e-3: the same argument with 11 bits (2^-12 relative rounding step); a single-ulp flip
//         on an element costs 5e-4 of that element, and flips are rare.
//   lse   is fp32 in every dtype (computed from identical rounded inputs in fp32): 1e-5.
#include <cmath>
#include <string>

#include "core/context.h"
#include "kernels/attention.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

struct Case {
  const char* label;
  AttentionShape shape;
};

const Case kCases[] = {
    {"hd 64, GQA 4/2, S 100", {2, 100, 4, 2, 64}},
    {"hd 128, MQA 4/1, S 77", {1, 77, 4, 1, 128}},
    {"hd 32, GQA 4/2, S 100", {2, 100, 4, 2, 32}},
};

const Tolerance kFwdTol{1e-5, 1e-2, 2e-3};
const Tolerance kBwdTol{2e-5, 1e-2, 2e-3};
const Tolerance kLseTol{1e-5, 1e-5, 1e-5};

// qkv in [-2, 2): with scale = 1/√hd the score rows reach a spread of ~8, so softmax rows are far
// from uniform and the max subtraction and the online rescaling matter.
Tensor make_qkv(const AttentionShape& s, DType dt, const CheckEnv& env, std::uint64_t salt) {
  return random_tensor({s.batch * s.seq, s.qkv_width()}, dt, *env.host, env.seed * 7919 + salt, -2.0f, 2.0f);
}

std::vector<CheckResult> run_eager(const Case& c, const CheckEnv& env, DType dt) {
  const AttentionShape& s = c.shape;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  ExecContext hctx{env.host, nullptr}, dctx{env.device, nullptr};
  const Tensor qkv = make_qkv(s, dt, env, 1);
  const Tensor dout = random_tensor({s.batch * s.seq, s.out_width()}, dt, *env.host, env.seed * 7919 + 2);
  const Shape probs_shape{s.batch, s.n_heads, s.seq, s.seq};

  // CPU reference.
  Tensor out = Tensor::empty({s.batch * s.seq, s.out_width()}, dt, *env.host, "selftest ref");
  Tensor probs = Tensor::empty(probs_shape, dt, *env.host, "selftest ref");
  Tensor dqkv = Tensor::empty(qkv.shape(), dt, *env.host, "selftest ref");
  attention_eager_forward(out, probs, qkv, s, scale, hctx);
  attention_eager_backward(dqkv, dout, probs, qkv, s, scale, hctx);

  // Device.
  const Tensor d_qkv = to_device(qkv, *env.device), d_dout = to_device(dout, *env.device);
  Tensor d_out = poisoned(out.shape(), dt, *env.device);
  Tensor d_probs = poisoned(probs_shape, dt, *env.device);
  attention_eager_forward(d_out, d_probs, d_qkv, s, scale, dctx);
  const Tensor d_probs_ref = to_device(probs, *env.device);  // backward on the CPU's probabilities
  Tensor d_dqkv = poisoned(qkv.shape(), dt, *env.device);
  attention_eager_backward(d_dqkv, d_dout, d_probs_ref, d_qkv, s, scale, dctx);

  return {compare("out", d_out, out, kFwdTol, dt), compare("probs", d_probs, probs, kFwdTol, dt),
          compare("dqkv", d_dqkv, dqkv, kBwdTol, dt)};
}

std::vector<CheckResult> run_flash(const Case& c, const CheckEnv& env, DType dt) {
  const AttentionShape& s = c.shape;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  ExecContext hctx{env.host, nullptr}, dctx{env.device, nullptr};
  const Tensor qkv = make_qkv(s, dt, env, 3);
  const Tensor dout = random_tensor({s.batch * s.seq, s.out_width()}, dt, *env.host, env.seed * 7919 + 4);
  const Shape lse_shape{s.batch, s.n_heads, s.seq};

  Tensor out = Tensor::empty({s.batch * s.seq, s.out_width()}, dt, *env.host, "selftest ref");
  Tensor lse = Tensor::empty(lse_shape, DType::kF32, *env.host, "selftest ref");
  Tensor dqkv = Tensor::empty(qkv.shape(), dt, *env.host, "selftest ref");
  attention_flash_forward(out, lse, qkv, s, scale, hctx);
  attention_flash_backward(dqkv, dout, out, lse, qkv, s, scale, hctx);

  const Tensor d_qkv = to_device(qkv, *env.device), d_dout = to_device(dout, *env.device);
  Tensor d_out = poisoned(out.shape(), dt, *env.device);
  Tensor d_lse = poisoned(lse_shape, DType::kF32, *env.device);
  attention_flash_forward(d_out, d_lse, d_qkv, s, scale, dctx);
  // Backward on the CPU's out and lse (D = rowsum(dO ⊙ O) then matches the reference's).
  const Tensor d_out_ref = to_device(out, *env.device), d_lse_ref = to_device(lse, *env.device);
  Tensor d_dqkv = poisoned(qkv.shape(), dt, *env.device);
  attention_flash_backward(d_dqkv, d_dout, d_out_ref, d_lse_ref, d_qkv, s, scale, dctx);

  return {compare("out", d_out, out, kFwdTol, dt), compare("lse", d_lse, lse, kLseTol, dt),
          compare("dqkv", d_dqkv, dqkv, kBwdTol, dt)};
}

}  // namespace

std::vector<OpCheck> attention_checks() {
  std::vector<OpCheck> checks;
  const std::vector<DType> dtypes{DType::kF32, DType::kBF16, DType::kF16};
  for (const Case& c : kCases) {
    checks.push_back({"attention", std::string("eager attention (") + c.label + ")", dtypes,
                      [&c](const CheckEnv& env, DType dt) { return run_eager(c, env, dt); }});
    checks.push_back({"attention", std::string("flash attention (") + c.label + ")", dtypes,
                      [&c](const CheckEnv& env, DType dt) { return run_flash(c, env, dt); }});
  }
  return checks;
}

}  // namespace scalelab::kernels::selftest
