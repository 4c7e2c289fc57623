// Checks of the norm family (see kernels/selftest.h for how a check works): RMSNorm and LayerNorm,
// plain and fused with the residual add, forward, backward and recompute.
//
// Tolerances: the defaults of Tolerance (fp32 1e-5, bf16 1e-2, fp16 2e-3). Both sides compute in
// fp32 from the same inputs; they differ in the order of the row and column sums only, so fp32
// results agree to ~1e-7 and low-precision ones to an occasional last-bit flip of the rounding.
// The saved statistics (rstd, mean; always fp32) are compared with the activation dtype's
// tolerance, since a flip in a rounded residual h moves them by that much.
// Parameter gradients accumulate: dw/db start from the same random values on both sides.
#include <cstdint>

#include "kernels/fused.h"
#include "kernels/layernorm.h"
#include "kernels/norm.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr float kEps = 1e-5f;


// --- RMSNorm --------------------------------------------------------------------------------

// R rows of H; the weight (and its gradient) in fp32 when f32_weight, else in the activations' dtype.
std::vector<CheckResult> rmsnorm_check(const CheckEnv& env, DType dt, std::int64_t R, std::int64_t H, bool f32_weight) {
  Sides s(env);
  const Tolerance tol;
  const DType wdt = f32_weight ? DType::kF32 : dt;
  std::vector<CheckResult> out;
  const Tensor x = s.rnd({R, H}, dt, 1), w = s.rnd({H}, wdt, 2, 0.5f, 1.5f);
  // Forward.
  Tensor y = s.host_out({R, H}, dt), rstd = s.host_out({R}, DType::kF32);
  rmsnorm_forward(y, rstd, x, w, kEps, s.host);
  Tensor yd = s.dev_out({R, H}, dt), rstdd = s.dev_out({R}, DType::kF32);
  rmsnorm_forward(yd, rstdd, s.on_dev(x), s.on_dev(w), kEps, s.dev);
  out.push_back(compare("y", yd, y, tol, dt));
  out.push_back(compare("rstd", rstdd, rstd, tol, dt));
  // Backward from the host's saved rstd, assigned and accumulated dx.
  const Tensor dy = s.rnd({R, H}, dt, 3);
  const Tensor dw0 = s.rnd({H}, wdt, 4);
  for (bool acc : {false, true}) {
    const Tensor dx0 = s.rnd({R, H}, dt, 5);
    Tensor dx = acc ? dx0.to(*env.host) : s.host_out({R, H}, dt), dw = dw0.to(*env.host);
    rmsnorm_backward(dx, dw, dy, x, rstd, w, s.host, acc);
    Tensor dxd = acc ? s.on_dev(dx0) : s.dev_out({R, H}, dt), dwd = s.on_dev(dw0);
    rmsnorm_backward(dxd, dwd, s.on_dev(dy), s.on_dev(x), s.on_dev(rstd), s.on_dev(w), s.dev, acc);
    out.push_back(compare(acc ? "dx (accumulated)" : "dx", dxd, dx, tol, dt));
    out.push_back(compare(acc ? "dw (second call)" : "dw", dwd, dw, tol, dt));
  }
  return out;
}

std::vector<CheckResult> rmsnorm_residual_check(const CheckEnv& env, DType dt) {
  Sides s(env);
  const Tolerance tol;
  const std::int64_t R = 64, H = 96;
  std::vector<CheckResult> out;
  const Tensor x = s.rnd({R, H}, dt, 11), delta = s.rnd({R, H}, dt, 12), w = s.rnd({H}, dt, 13, 0.5f, 1.5f);
  // Forward with h written over delta (the model's in-place residual add).
  Tensor h = delta.to(*env.host), y = s.host_out({R, H}, dt), rstd = s.host_out({R}, DType::kF32);
  rmsnorm_residual_forward(h, y, rstd, x, h, w, kEps, s.host);
  Tensor hd = s.on_dev(delta), yd = s.dev_out({R, H}, dt), rstdd = s.dev_out({R}, DType::kF32);
  rmsnorm_residual_forward(hd, yd, rstdd, s.on_dev(x), hd, s.on_dev(w), kEps, s.dev);
  out.push_back(compare("h", hd, h, tol, dt));
  out.push_back(compare("y", yd, y, tol, dt));
  out.push_back(compare("rstd", rstdd, rstd, tol, dt));
  // Forward into a separate h (no aliasing).
  Tensor h2 = s.host_out({R, H}, dt), y2 = s.host_out({R, H}, dt), r2 = s.host_out({R}, DType::kF32);
  rmsnorm_residual_forward(h2, y2, r2, x, delta, w, kEps, s.host);
  Tensor h2d = s.dev_out({R, H}, dt), y2d = s.dev_out({R, H}, dt), r2d = s.dev_out({R}, DType::kF32);
  rmsnorm_residual_forward(h2d, y2d, r2d, s.on_dev(x), s.on_dev(delta), s.on_dev(w), kEps, s.dev);
  out.push_back(compare("h (separate)", h2d, h2, tol, dt));
  out.push_back(compare("y (separate)", y2d, y2, tol, dt));
  // Recompute from the host's h and rstd.
  Tensor yr = s.host_out({R, H}, dt);
  rmsnorm_recompute(yr, h, rstd, w, s.host);
  Tensor yrd = s.dev_out({R, H}, dt);
  rmsnorm_recompute(yrd, s.on_dev(h), s.on_dev(rstd), s.on_dev(w), s.dev);
  out.push_back(compare("y (recompute)", yrd, yr, tol, dt));
  // Backward: dh accumulates onto the residual path's gradient, dw accumulates.
  const Tensor dy = s.rnd({R, H}, dt, 14), dh0 = s.rnd({R, H}, dt, 15), dw0 = s.rnd({H}, dt, 16);
  Tensor dh = dh0.to(*env.host), dw = dw0.to(*env.host);
  rmsnorm_residual_backward(dh, dw, dy, h, rstd, w, s.host);
  Tensor dhd = s.on_dev(dh0), dwd = s.on_dev(dw0);
  rmsnorm_residual_backward(dhd, dwd, s.on_dev(dy), s.on_dev(h), s.on_dev(rstd), s.on_dev(w), s.dev);
  out.push_back(compare("dh", dhd, dh, tol, dt));
  out.push_back(compare("dw", dwd, dw, tol, dt));
  return out;
}

// --- LayerNorm ------------------------------------------------------------------------------

std::vector<CheckResult> layernorm_check(const CheckEnv& env, DType dt, bool affine, bool bias) {
  Sides s(env);
  const Tolerance tol;
  const std::int64_t R = 64, H = 96;
  std::vector<CheckResult> out;
  // An offset mean, so the centering matters.
  const Tensor x = s.rnd({R, H}, dt, 21, -0.5f, 1.5f);
  const Tensor w = affine ? s.rnd({H}, dt, 22, 0.5f, 1.5f) : Tensor();
  const Tensor b = bias ? s.rnd({H}, dt, 23) : Tensor();
  const Tensor wd = affine ? s.on_dev(w) : Tensor(), bd = bias ? s.on_dev(b) : Tensor();
  Tensor y = s.host_out({R, H}, dt), mean = s.host_out({R}, DType::kF32), rstd = s.host_out({R}, DType::kF32);
  layernorm_forward(y, mean, rstd, x, w, b, kEps, s.host);
  Tensor yd = s.dev_out({R, H}, dt), meand = s.dev_out({R}, DType::kF32), rstdd = s.dev_out({R}, DType::kF32);
  layernorm_forward(yd, meand, rstdd, s.on_dev(x), wd, bd, kEps, s.dev);
  out.push_back(compare("y", yd, y, tol, dt));
  out.push_back(compare("mean", meand, mean, tol, dt));
  out.push_back(compare("rstd", rstdd, rstd, tol, dt));
  const Tensor dy = s.rnd({R, H}, dt, 24);
  const Tensor dw0 = s.rnd({H}, dt, 25), db0 = s.rnd({H}, dt, 26);
  for (bool acc : {false, true}) {
    const Tensor dx0 = s.rnd({R, H}, dt, 27);
    Tensor dx = acc ? dx0.to(*env.host) : s.host_out({R, H}, dt);
    Tensor dw = dw0.to(*env.host), db = db0.to(*env.host);
    layernorm_backward(dx, affine ? &dw : nullptr, bias ? &db : nullptr, dy, x, mean, rstd, w, s.host, acc);
    Tensor dxd = acc ? s.on_dev(dx0) : s.dev_out({R, H}, dt), dwd = s.on_dev(dw0), dbd = s.on_dev(db0);
    layernorm_backward(dxd, affine ? &dwd : nullptr, bias ? &dbd : nullptr, s.on_dev(dy), s.on_dev(x),
                       s.on_dev(mean), s.on_dev(rstd), wd, s.dev, acc);
    out.push_back(compare(acc ? "dx (accumulated)" : "dx", dxd, dx, tol, dt));
    if (affine) out.push_back(compare(acc ? "dw (second call)" : "dw", dwd, dw, tol, dt));
    if (bias) out.push_back(compare(acc ? "db (second call)" : "db", dbd, db, tol, dt));
  }
  return out;
}

std::vector<CheckResult> layernorm_residual_check(const CheckEnv& env, DType dt, bool affine) {
  Sides s(env);
  const Tolerance tol;
  const std::int64_t R = 64, H = 96;
  std::vector<CheckResult> out;
  const Tensor x = s.rnd({R, H}, dt, 31), delta = s.rnd({R, H}, dt, 32, -0.5f, 1.5f);
  const Tensor w = affine ? s.rnd({H}, dt, 33, 0.5f, 1.5f) : Tensor();
  const Tensor b = affine ? s.rnd({H}, dt, 34) : Tensor();
  const Tensor wd = affine ? s.on_dev(w) : Tensor(), bd = affine ? s.on_dev(b) : Tensor();
  // Forward with h written over delta.
  Tensor h = delta.to(*env.host), y = s.host_out({R, H}, dt);
  Tensor mean = s.host_out({R}, DType::kF32), rstd = s.host_out({R}, DType::kF32);
  layernorm_residual_forward(h, y, mean, rstd, x, h, w, b, kEps, s.host);
  Tensor hd = s.on_dev(delta), yd = s.dev_out({R, H}, dt);
  Tensor meand = s.dev_out({R}, DType::kF32), rstdd = s.dev_out({R}, DType::kF32);
  layernorm_residual_forward(hd, yd, meand, rstdd, s.on_dev(x), hd, wd, bd, kEps, s.dev);
  out.push_back(compare("h", hd, h, tol, dt));
  out.push_back(compare("y", yd, y, tol, dt));
  out.push_back(compare("mean", meand, mean, tol, dt));
  out.push_back(compare("rstd", rstdd, rstd, tol, dt));
  // Recompute.
  Tensor yr = s.host_out({R, H}, dt);
  layernorm_recompute(yr, h, mean, rstd, w, b, s.host);
  Tensor yrd = s.dev_out({R, H}, dt);
  layernorm_recompute(yrd, s.on_dev(h), s.on_dev(mean), s.on_dev(rstd), wd, bd, s.dev);
  out.push_back(compare("y (recompute)", yrd, yr, tol, dt));
  // Backward: dh, dw, db accumulate.
  const Tensor dy = s.rnd({R, H}, dt, 35), dh0 = s.rnd({R, H}, dt, 36);
  const Tensor dw0 = s.rnd({H}, dt, 37), db0 = s.rnd({H}, dt, 38);
  Tensor dh = dh0.to(*env.host), dw = dw0.to(*env.host), db = db0.to(*env.host);
  layernorm_residual_backward(dh, affine ? &dw : nullptr, affine ? &db : nullptr, dy, h, mean, rstd, w, s.host);
  Tensor dhd = s.on_dev(dh0), dwd = s.on_dev(dw0), dbd = s.on_dev(db0);
  layernorm_residual_backward(dhd, affine ? &dwd : nullptr, affine ? &dbd : nullptr, s.on_dev(dy), s.on_dev(h),
                              s.on_dev(mean), s.on_dev(rstd), wd, s.dev);
  out.push_back(compare("dh", dhd, dh, tol, dt));
  if (affine) {
    out.push_back(compare("dw", dwd, dw, tol, dt));
    out.push_back(compare("db", dbd, db, tol, dt));
  }
  return out;
}

}  // namespace

std::vector<OpCheck> norm_checks() {
  return {
      {"norm", "rmsnorm", kAll,
       [](const CheckEnv& env, DType dt) { return rmsnorm_check(env, dt, 64, 96, false); }},
      // fp32 weight beside low-precision activations (mixed precision's master weights).
      {"norm", "rmsnorm (fp32 weight)", kAll,
       [](const CheckEnv& env, DType dt) { return rmsnorm_check(env, dt, 64, 96, true); }},
      // A row wider than one block's threads x 4 (each thread loops), and 3 row splits for dw.
      {"norm", "rmsnorm (wide rows)", kAll,
       [](const CheckEnv& env, DType dt) { return rmsnorm_check(env, dt, 70, 4500, false); }},
      {"norm", "rmsnorm_residual", kAll, rmsnorm_residual_check},
      {"norm", "layernorm", kAll, [](const CheckEnv& env, DType dt) { return layernorm_check(env, dt, true, true); }},
      {"norm", "layernorm (no bias)", kAll,
       [](const CheckEnv& env, DType dt) { return layernorm_check(env, dt, true, false); }},
      {"norm", "layernorm (no affine)", kAll,
       [](const CheckEnv& env, DType dt) { return layernorm_check(env, dt, false, false); }},
      {"norm", "layernorm_residual", kAll,
       [](const CheckEnv& env, DType dt) { return layernorm_residual_check(env, dt, true); }},
      {"norm", "layernorm_residual (no affine)", kAll,
       [](const CheckEnv& env, DType dt) { return layernorm_residual_check(env, dt, false); }},
  };
}

}  // namespace scalelab::kernels::selftest
