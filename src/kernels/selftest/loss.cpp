// Checks of the loss family and the fused linear + cross-entropy (see kernels/selftest.h).
//
// Tolerances:
//   lse (fp32 output, every logits dtype) 1e-5: the same stored logits on both sides, an fp32
//     log-sum-exp whose order differs (two-pass on the CPU, online on the device): a few ulps.
//   loss sum 1e-6 relative: per-row losses lse − logit[target] in double from fp32 lse (errors of a
//     few 1e-7 per row on values near log V, random in sign), summed in double on both sides.
//   count, count_target_tokens: exact (0).
//   token log-probabilities (fp32) 1e-5: logit[target] − lse from the same stored logit and an lse
//     within a few ulps (above). Their backward (dlogits = dlogp·(onehot − softmax), one weight
//     per row, of both signs): as dlogits.
//   dlogits: Tolerance for the logits dtype (fp32 1e-5: exp of the same fp32 argument, within a
//     few ulps; bf16 / fp16: the final rounding of the same fp32 value).
//   fused: the loss sum 1e-5 relative (the logits come from GEMMs whose summation orders differ,
//     ~sqrt(H)·2^-24 relative on each logit); dx, dw the dtype's Tolerance. With bf16/fp16 weights
//     the device rounds the logits gradient to the weights' dtype before its two GEMMs (cuBLASLt
//     multiplies operands of one type) where the CPU keeps it in fp32: a relative error of 2^-9
//     (bf16) or 2^-12 (fp16) per element, random in sign, well inside 1e-2 / 2e-3. The gradient
//     scale is 1/8 so that fp16 gradients stay normal numbers as they do under loss scaling.
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/context.h"
#include "kernels/fused.h"
#include "kernels/logprobs.h"
#include "kernels/loss.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr std::int64_t kRows = 64, kVocab = 512;
constexpr double kIgnored = 0.1;  // fraction of targets that are kIgnoreIndex

ExecContext context_on(DeviceAllocator* alloc) {
  ExecContext ctx;
  ctx.alloc = alloc;
  return ctx;
}

CheckResult scalar_check(const char* name, double out, double ref, double tolerance) {
  double err = std::fabs(out - ref) / (ref != 0.0 ? std::fabs(ref) : 1.0);
  if (!std::isfinite(out)) err = INFINITY;
  return {name, err, tolerance};
}

std::vector<CheckResult> cross_entropy_check(const CheckEnv& env, DType dt) {
  const Tolerance tol;
  DeviceAllocator& host = *env.host;
  DeviceAllocator& dev = *env.device;
  ExecContext hc = context_on(env.host), dc = context_on(env.device);
  // Logits spread like a trained model's (|z| up to 4): exp() over a useful range.
  const Tensor logits = random_tensor({kRows, kVocab}, dt, host, env.seed + 1, -4.0f, 4.0f);
  const Tensor targets = random_ids({kRows}, kVocab, host, env.seed + 2, kIgnored);
  const Tensor ld = to_device(logits, dev), td = to_device(targets, dev);
  std::vector<CheckResult> out;

  Tensor lse_ref = Tensor::empty({kRows}, DType::kF32, host, "selftest ref");
  const LossSum ref = cross_entropy_forward(lse_ref, logits, targets, hc);
  Tensor lse_dev = poisoned({kRows}, DType::kF32, dev);
  const LossSum got = cross_entropy_forward(lse_dev, ld, td, dc);
  out.push_back(compare("lse", lse_dev, lse_ref, tol, DType::kF32));
  out.push_back(scalar_check("loss sum", got.sum, ref.sum, 1e-6));
  out.push_back({"loss count", static_cast<double>(std::llabs(got.count - ref.count)), 0.0});

  const float scale = 1.0f / static_cast<float>(ref.count > 0 ? ref.count : 1);
  Tensor dl_ref = Tensor::empty({kRows, kVocab}, dt, host, "selftest ref");
  cross_entropy_backward(dl_ref, logits, lse_ref, targets, scale, hc);
  Tensor dl_dev = poisoned({kRows, kVocab}, dt, dev);
  cross_entropy_backward(dl_dev, ld, lse_dev, td, scale, dc);
  out.push_back(compare("dlogits", dl_dev, dl_ref, tol, dt));
  // In place: dlogits aliases logits.
  Tensor inplace = to_device(logits, dev);
  cross_entropy_backward(inplace, inplace, lse_dev, td, scale, dc);
  out.push_back(compare("dlogits (in place)", inplace, dl_ref, tol, dt));

  // Per-token log-probabilities and their backward (DPO's sequence-level loss).
  Tensor lp_ref = Tensor::empty({kRows}, DType::kF32, host, "selftest ref");
  token_logprobs_forward(lp_ref, logits, lse_ref, targets, hc);
  Tensor lp_dev = poisoned({kRows}, DType::kF32, dev);
  token_logprobs_forward(lp_dev, ld, lse_dev, td, dc);
  out.push_back(compare("token logprobs", lp_dev, lp_ref, tol, DType::kF32));
  const Tensor dlogp = random_tensor({kRows}, DType::kF32, host, env.seed + 3, -1.0f, 1.0f);
  const Tensor dlogp_dev = to_device(dlogp, dev);
  Tensor dlp_ref = Tensor::empty({kRows, kVocab}, dt, host, "selftest ref");
  token_logprobs_backward(dlp_ref, logits, lse_ref, targets, dlogp, hc);
  Tensor dlp_dev = poisoned({kRows, kVocab}, dt, dev);
  token_logprobs_backward(dlp_dev, ld, lse_dev, td, dlogp_dev, dc);
  out.push_back(compare("token logprobs dlogits", dlp_dev, dlp_ref, tol, dt));

  out.push_back({"count_target_tokens",
                 static_cast<double>(std::llabs(count_target_tokens(td) - count_target_tokens(targets))), 0.0});
  return out;
}

// x[T, H] · w[V, H]ᵀ with the loss and gradients, in chunks that do not divide T.
// V: 512 (one tile of the CUDA kernel's 16-bit packed path), 4104 (three tiles of 2048 logits
// with a short last one: the in-place write order across tiles), 1001 (not a multiple of 8: the
// element-wise path).
std::vector<CheckResult> fused_loss_check_v(const CheckEnv& env, DType dt, std::int64_t V) {
  const Tolerance tol;
  DeviceAllocator& host = *env.host;
  DeviceAllocator& dev = *env.device;
  ExecContext hc = context_on(env.host), dc = context_on(env.device);
  const std::int64_t T = 80, H = 64, chunk = 32;  // chunks of 32, 32, 16 rows
  const Tensor x = random_tensor({T, H}, dt, host, env.seed + 11);
  const Tensor w = random_tensor({V, H}, dt, host, env.seed + 12, -0.5f, 0.5f);
  const Tensor targets = random_ids({T}, V, host, env.seed + 13, kIgnored);
  const Tensor dw0 = random_tensor({V, H}, dt, host, env.seed + 14);
  const Tensor xd = to_device(x, dev), wd = to_device(w, dev), td = to_device(targets, dev);
  const float scale = 0.125f;
  std::vector<CheckResult> out;

  Tensor dx_ref = Tensor::empty({T, H}, dt, host, "selftest ref");
  Tensor dw_ref = dw0.to(host, "selftest copy");
  const LossSum ref = fused_linear_cross_entropy(dx_ref, dw_ref, x, w, targets, scale, chunk, hc);
  Tensor dx_dev = poisoned({T, H}, dt, dev);
  Tensor dw_dev = to_device(dw0, dev);
  const LossSum got = fused_linear_cross_entropy(dx_dev, dw_dev, xd, wd, td, scale, chunk, dc);
  out.push_back(scalar_check("loss sum", got.sum, ref.sum, 1e-5));
  out.push_back({"loss count", static_cast<double>(std::llabs(got.count - ref.count)), 0.0});
  out.push_back(compare("dx", dx_dev, dx_ref, tol, dt));
  out.push_back(compare("dw", dw_dev, dw_ref, tol, dt));

  const LossSum fref = fused_linear_cross_entropy_forward(x, w, targets, chunk, hc);
  const LossSum fgot = fused_linear_cross_entropy_forward(xd, wd, td, chunk, dc);
  out.push_back(scalar_check("loss sum (forward only)", fgot.sum, fref.sum, 1e-5));
  out.push_back({"loss count (forward only)", static_cast<double>(std::llabs(fgot.count - fref.count)), 0.0});
  return out;
}

}  // namespace

std::vector<OpCheck> loss_checks() {
  const std::vector<DType> all = {DType::kF32, DType::kBF16, DType::kF16};
  return {
      {"loss", "cross_entropy", all, cross_entropy_check},
      {"loss", "fused linear cross-entropy", all,
       [](const CheckEnv& env, DType dt) { return fused_loss_check_v(env, dt, kVocab); }},
      {"loss", "fused linear cross-entropy, V 4104", all,
       [](const CheckEnv& env, DType dt) { return fused_loss_check_v(env, dt, 4104); }},
      {"loss", "fused linear cross-entropy, V 1001", all,
       [](const CheckEnv& env, DType dt) { return fused_loss_check_v(env, dt, 1001); }},
  };
}

}  // namespace scalelab::kernels::selftest
