// Checks of the elementwise and activation families (see kernels/selftest.h for how a check
// works): residual adds, SwiGLU, ReLU/GELU, bias add, and the fused MLP forms of fused.h.
//
// Tolerances: the defaults of Tolerance (fp32 1e-5, bf16 1e-2, fp16 2e-3) — pointwise fp32 math
// on identical inputs (SwiGLU's sigmoid even uses the CPU's exp polynomial on the device; GELU's
// erf differs by an ulp or two). The one exception, swiglu_down_backward_recompute, goes through
// two GEMMs whose fp32 accumulation order differs between the CPU BLAS and cuBLASLt: fp32 1e-4.
// In-place and aliased forms are checked in the aliasing the model uses.
#include <cstdint>

#include "kernels/activation.h"
#include "kernels/backend.h"
#include "kernels/elementwise.h"
#include "kernels/fused.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr std::int64_t kT = 64, kI = 96;

// a += b and out = a + b; `bt` the dtype of b (mixed dtypes as the residual stream may have).
std::vector<CheckResult> add_check(const CheckEnv& env, DType dt, DType bt) {
  Sides s(env);
  const Tolerance tol;
  const Tensor a = s.rnd({kT, kI}, dt, 1), b = s.rnd({kT, kI}, bt, 2);
  Tensor ah = s.host_copy(a);
  add_(ah, b, s.host);
  Tensor ad = s.on_dev(a);
  add_(ad, s.on_dev(b), s.dev);
  // An odd element count exercises the vectorized kernel's tail.
  const Tensor c = s.rnd({kT * kI + 5}, dt, 3), e = s.rnd({kT * kI + 5}, bt, 4);
  Tensor o = s.host_out({kT * kI + 5}, dt);
  add(o, c, e, s.host);
  Tensor od = s.dev_out({kT * kI + 5}, dt);
  add(od, s.on_dev(c), s.on_dev(e), s.dev);
  return {compare("a (add_)", ad, ah, tol, dt), compare("out (add)", od, o, tol, dt)};
}

std::vector<CheckResult> swiglu_check(const CheckEnv& env, DType dt) {
  Sides s(env);
  const Tolerance tol;
  const Tensor gu = s.rnd({kT, 2 * kI}, dt, 11, -4.0f, 4.0f), dh = s.rnd({kT, kI}, dt, 12);
  Tensor h = s.host_out({kT, kI}, dt);
  swiglu_forward(h, gu, s.host);
  Tensor hd = s.dev_out({kT, kI}, dt);
  swiglu_forward(hd, s.on_dev(gu), s.dev);
  Tensor dgu = s.host_out({kT, 2 * kI}, dt);
  swiglu_backward(dgu, dh, gu, s.host);
  Tensor dgud = s.dev_out({kT, 2 * kI}, dt);
  swiglu_backward(dgud, s.on_dev(dh), s.on_dev(gu), s.dev);
  return {compare("h", hd, h, tol, dt), compare("dgu", dgud, dgu, tol, dt)};
}

std::vector<CheckResult> swiglu_recompute_check(const CheckEnv& env, DType dt, bool aliased) {
  Sides s(env);
  const Tolerance tol;
  const Tensor gu = s.rnd({kT, 2 * kI}, dt, 21, -4.0f, 4.0f), dh = s.rnd({kT, kI}, dt, 22);
  if (aliased) {
    // act written over dh and dgu over gu, as the fused MLP backward does.
    Tensor g = s.host_copy(gu), a = s.host_copy(dh);
    swiglu_backward_recompute(g, a, a, g, s.host);
    Tensor gd = s.on_dev(gu), ad = s.on_dev(dh);
    swiglu_backward_recompute(gd, ad, ad, gd, s.dev);
    return {compare("dgu (over gu)", gd, g, tol, dt), compare("act (over dh)", ad, a, tol, dt)};
  }
  Tensor g = s.host_out({kT, 2 * kI}, dt), a = s.host_out({kT, kI}, dt);
  swiglu_backward_recompute(g, a, dh, gu, s.host);
  Tensor gd = s.dev_out({kT, 2 * kI}, dt), ad = s.dev_out({kT, kI}, dt);
  swiglu_backward_recompute(gd, ad, s.on_dev(dh), s.on_dev(gu), s.dev);
  return {compare("dgu", gd, g, tol, dt), compare("act", ad, a, tol, dt)};
}

std::vector<CheckResult> swiglu_down_check(const CheckEnv& env, DType dt) {
  Sides s(env);
  Tolerance tol;
  tol.f32 = 1e-4;  // two GEMMs: the accumulation order of CPU BLAS and cuBLASLt differs
  const std::int64_t H = 48;
  const Tensor dout = s.rnd({kT, H}, dt, 31), gu = s.rnd({kT, 2 * kI}, dt, 32, -4.0f, 4.0f);
  const Tensor wdown = s.rnd({H, kI}, dt, 33), dw0 = s.rnd({H, kI}, dt, 34);
  Tensor dgu = s.host_out({kT, 2 * kI}, dt), dw = s.host_copy(dw0);
  swiglu_down_backward_recompute(dgu, dw, dout, gu, wdown, s.host);
  Tensor dgud = s.dev_out({kT, 2 * kI}, dt), dwd = s.on_dev(dw0);
  swiglu_down_backward_recompute(dgud, dwd, s.on_dev(dout), s.on_dev(gu), s.on_dev(wdown), s.dev);
  return {compare("dgu", dgud, dgu, tol, dt), compare("dwdown", dwd, dw, tol, dt)};
}

std::vector<CheckResult> activation_check(const CheckEnv& env, DType dt, Activation act) {
  Sides s(env);
  const Tolerance tol;
  const Tensor x = s.rnd({kT, kI}, dt, 41, -3.0f, 3.0f), dy = s.rnd({kT, kI}, dt, 42);
  Tensor y = s.host_out({kT, kI}, dt);
  activation_forward(y, x, act, s.host);
  Tensor yd = s.dev_out({kT, kI}, dt);
  activation_forward(yd, s.on_dev(x), act, s.dev);
  Tensor dx = s.host_out({kT, kI}, dt);
  activation_backward(dx, dy, x, act, s.host);
  Tensor dxd = s.dev_out({kT, kI}, dt);
  activation_backward(dxd, s.on_dev(dy), s.on_dev(x), act, s.dev);
  // In place (y over x, dx over dy), as the header allows.
  Tensor yi = s.host_copy(x), dxi = s.host_copy(dy);
  activation_forward(yi, yi, act, s.host);
  activation_backward(dxi, dxi, x, act, s.host);
  Tensor yid = s.on_dev(x), dxid = s.on_dev(dy);
  activation_forward(yid, yid, act, s.dev);
  activation_backward(dxid, dxid, s.on_dev(x), act, s.dev);
  return {compare("y", yd, y, tol, dt), compare("dx", dxd, dx, tol, dt), compare("y (in place)", yid, yi, tol, dt),
          compare("dx (in place)", dxid, dxi, tol, dt)};
}

// bias_add_ has no front (composed fallbacks call it on their backend): both backends directly.
std::vector<CheckResult> bias_add_check(const CheckEnv& env, DType dt) {
  Sides s(env);
  const Tolerance tol;
  const Tensor y0 = s.rnd({kT, kI}, dt, 51), b = s.rnd({kI}, dt, 52);
  Tensor y = s.host_copy(y0);
  backend_for(DeviceType::kCPU, "bias_add_").bias_add_(y, b, s.host);
  Tensor yd = s.on_dev(y0);
  backend_for(env.device->device(), "bias_add_").bias_add_(yd, s.on_dev(b), s.dev);
  return {compare("y", yd, y, tol, dt)};
}

std::vector<CheckResult> bias_relu_check(const CheckEnv& env, DType dt, bool bias) {
  Sides s(env);
  const Tolerance tol;
  const Tensor x = s.rnd({kT, kI}, dt, 61), b = bias ? s.rnd({kI}, dt, 62) : Tensor();
  const Tensor bd = bias ? s.on_dev(b) : Tensor();
  // Forward in place (the fc1 output becomes the activation).
  Tensor y = s.host_copy(x);
  bias_relu_forward(y, y, b, s.host);
  Tensor yd = s.on_dev(x);
  bias_relu_forward(yd, yd, bd, s.dev);
  // Backward from the host's y: dx over dy, db accumulating.
  const Tensor dy = s.rnd({kT, kI}, dt, 63), db0 = s.rnd({kI}, dt, 64);
  Tensor dx = s.host_copy(dy), db = s.host_copy(db0);
  bias_relu_backward(dx, bias ? &db : nullptr, dx, y, s.host);
  Tensor dxd = s.on_dev(dy), dbd = s.on_dev(db0);
  bias_relu_backward(dxd, bias ? &dbd : nullptr, dxd, s.on_dev(y), s.dev);
  std::vector<CheckResult> out = {compare("y (in place)", yd, y, tol, dt), compare("dx (over dy)", dxd, dx, tol, dt)};
  if (bias) out.push_back(compare("db", dbd, db, tol, dt));
  return out;
}

}  // namespace

std::vector<OpCheck> elementwise_checks() {
  return {
      {"elementwise", "add", kAll, [](const CheckEnv& env, DType dt) { return add_check(env, dt, dt); }},
      {"elementwise", "add (fp32 b)", kAll,
       [](const CheckEnv& env, DType dt) { return add_check(env, dt, DType::kF32); }},
      {"elementwise", "swiglu", kAll, swiglu_check},
      {"elementwise", "swiglu_backward_recompute", kAll,
       [](const CheckEnv& env, DType dt) { return swiglu_recompute_check(env, dt, false); }},
      {"elementwise", "swiglu_backward_recompute (aliased)", kAll,
       [](const CheckEnv& env, DType dt) { return swiglu_recompute_check(env, dt, true); }},
      {"elementwise", "swiglu_down_backward_recompute", kAll, swiglu_down_check},
      {"elementwise", "relu", kAll,
       [](const CheckEnv& env, DType dt) { return activation_check(env, dt, Activation::kReLU); }},
      {"elementwise", "gelu", kAll,
       [](const CheckEnv& env, DType dt) { return activation_check(env, dt, Activation::kGELU); }},
      {"elementwise", "bias_add_", kAll, bias_add_check},
      {"elementwise", "bias_relu", kAll, [](const CheckEnv& env, DType dt) { return bias_relu_check(env, dt, true); }},
      {"elementwise", "bias_relu (no bias)", kAll,
       [](const CheckEnv& env, DType dt) { return bias_relu_check(env, dt, false); }},
  };
}

}  // namespace scalelab::kernels::selftest
