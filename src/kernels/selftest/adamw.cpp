// Checks of the adamw family: the update, the gradient norm helpers (see kernels/selftest.h).
//
// Tolerances:
//   adamw, fp32 parameters and states 1e-6: the device evaluates the CPU's expression operation by
//     operation in IEEE fp32 (no fused multiply-adds), so elements agree to the last bit unless the
//     CPU's compiler contracted a product into an FMA differently — at most an ulp or two of the
//     ~1e-3 update on values of order 1 (rel. < 1e-7).
//   adamw, bf16 parameters (stochastic rounding): the random bits are the CPU's (same hash of seed,
//     step and index), so the stored parameters are bit-identical except where the fp32 values
//     differ by an ulp AND that ulp changes the rounding (probability ~2^-16 per such element).
//     Checked element by element: no parameter more than 1 bf16 ulp from the CPU's. The norm-wise
//     comparison of parameters uses 1e-3 (one 1-ulp element in 4096 of order 1 gives ~6e-5).
//   adamw, bf16 / fp16 states and fp16 parameters: round to nearest even of (nearly) the same fp32
//     values: the dtype's Tolerance.
//   sum_of_squares 1e-5 relative: both sides square in fp32 and accumulate partials in fp32 (the
//     device over 16 elements, bound 1e-6; the CPU over 8192 per accumulator, typically ~1e-6)
//     before a double sum.
//   has_non_finite: exact. scale_: exact (one IEEE multiply and one round to nearest even).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/context.h"
#include "kernels/adamw.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr std::int64_t kN = 5000;

ExecContext context_on(DeviceAllocator* alloc) {
  ExecContext ctx;
  ctx.alloc = alloc;
  return ctx;
}

// Largest distance, in bf16 ulps, between two bf16 tensors of equal length (any devices).
double max_bf16_ulps(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel() || a.dtype() != DType::kBF16 || b.dtype() != DType::kBF16)
    return std::numeric_limits<double>::infinity();
  std::vector<std::uint16_t> ha(static_cast<std::size_t>(a.numel())), hb(ha.size());
  a.copy_to_host(ha.data());
  b.copy_to_host(hb.data());
  // A monotonic integer key of the bf16 value (sign-magnitude to offset binary).
  auto key = [](std::uint16_t v) -> std::int32_t {
    return (v & 0x8000u) ? 0x8000 - static_cast<std::int32_t>(v & 0x7fffu) : 0x8000 + static_cast<std::int32_t>(v);
  };
  double worst = 0;
  for (std::size_t i = 0; i < ha.size(); ++i) {
    if ((ha[i] & 0x7f80u) == 0x7f80u) return std::numeric_limits<double>::infinity();  // inf / NaN
    worst = std::max(worst, static_cast<double>(std::abs(key(ha[i]) - key(hb[i]))));
  }
  return worst;
}

std::vector<CheckResult> adamw_check(const CheckEnv& env, DType param_dt, DType state_dt) {
  const Tolerance tol;
  DeviceAllocator& host = *env.host;
  DeviceAllocator& dev = *env.device;
  ExecContext hc = context_on(env.host), dc = context_on(env.device);
  const std::uint64_t s = env.seed + 20;
  const Tensor p0 = random_tensor({kN}, param_dt, host, s + 1);
  const Tensor m0 = random_tensor({kN}, state_dt, host, s + 2, -1e-2f, 1e-2f);
  const Tensor v0 = random_tensor({kN}, state_dt, host, s + 3, 1e-5f, 1e-4f);  // v > 0
  const Tensor g = random_tensor({kN}, param_dt, host, s + 4, -1e-2f, 1e-2f);
  // Decay and no-decay ranges, with a gap [1300, 1500) that must stay untouched.
  const std::vector<ElementRange> ranges = {{0, 1000, true}, {1000, 1300, false}, {1500, kN, true}};
  AdamWHyper hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  hp.step = 7;
  hp.grad_scale = 0.5f;
  hp.rounding_seed = 0x5ca1ab1eull + env.seed;

  Tensor p_ref = p0.to(host), m_ref = m0.to(host), v_ref = v0.to(host);
  adamw_update(p_ref, m_ref, v_ref, g, ranges, hp, hc);
  Tensor p_dev = to_device(p0, dev), m_dev = to_device(m0, dev), v_dev = to_device(v0, dev);
  const Tensor g_dev = to_device(g, dev);
  adamw_update(p_dev, m_dev, v_dev, g_dev, ranges, hp, dc);

  std::vector<CheckResult> out;
  const Tolerance exactish{1e-6, 1e-2, 2e-3};
  if (param_dt == DType::kBF16) {
    out.push_back({"params", rel_error(p_dev, p_ref), 1e-3});
    out.push_back({"params (max bf16 ulps from the CPU)", max_bf16_ulps(p_dev, p_ref), 1.0});
  } else {
    out.push_back(compare("params", p_dev, p_ref, exactish, param_dt));
  }
  out.push_back(compare("exp_avg", m_dev, m_ref, exactish, state_dt));
  out.push_back(compare("exp_avg_sq", v_dev, v_ref, exactish, state_dt));
  return out;
}

std::vector<CheckResult> norm_check(const CheckEnv& env, DType dt) {
  DeviceAllocator& host = *env.host;
  DeviceAllocator& dev = *env.device;
  ExecContext hc = context_on(env.host), dc = context_on(env.device);
  // Longer than the CPU's 65536-element chunk, not a multiple of any block size.
  const std::int64_t n = 100003;
  const Tensor g = random_tensor({n}, dt, host, env.seed + 31);
  const Tensor gd = to_device(g, dev);
  std::vector<CheckResult> out;

  const double ref = sum_of_squares(g, hc), got = sum_of_squares(gd, dc);
  out.push_back({"sum_of_squares", std::isfinite(got) ? std::fabs(got - ref) / ref : INFINITY, 1e-5});

  // has_non_finite: false on the random gradient, true with one inf and with one NaN.
  auto flag_error = [](bool got_flag, bool want) { return got_flag == want ? 0.0 : 1.0; };
  out.push_back({"has_non_finite (finite)", flag_error(has_non_finite(gd, dc), has_non_finite(g, hc)), 0.0});
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> v(static_cast<std::size_t>(n));
    Tensor gf = Tensor::empty({n}, DType::kF32, host, "selftest input");
    gf.copy_from(g);
    gf.copy_to_host(v.data());
    v[static_cast<std::size_t>(n - 7)] = bad;
    Tensor gb = Tensor::empty({n}, dt, host, "selftest input");
    convert(v.data(), DType::kF32, gb.raw(), dt, v.size());
    const Tensor gbd = to_device(gb, dev);
    out.push_back({std::isinf(bad) ? "has_non_finite (inf)" : "has_non_finite (NaN)",
                   flag_error(has_non_finite(gbd, dc), has_non_finite(gb, hc)), 0.0});
  }

  // scale_ in place.
  Tensor sref = g.to(host), sdev = to_device(g, dev);
  scale_(sref, 0.37f, hc);
  scale_(sdev, 0.37f, dc);
  out.push_back({"scale_", rel_error(sdev, sref), 0.0});
  return out;
}

}  // namespace

std::vector<OpCheck> adamw_checks() {
  const std::vector<DType> all = {DType::kF32, DType::kBF16, DType::kF16};
  return {
      // Parameters and gradients in the run's dtype, fp32 optimizer states (fp32 and mixed
      // precision, and --model-precision bf16 --optim-state-dtype fp32).
      {"adamw", "adamw (fp32 states)", all,
       [](const CheckEnv& env, DType dt) { return adamw_check(env, dt, DType::kF32); }},
      // --model-precision bf16: states in the parameter dtype.
      {"adamw", "adamw (bf16 states)", {DType::kBF16},
       [](const CheckEnv& env, DType dt) { return adamw_check(env, dt, dt); }},
      {"adamw", "sum_of_squares / has_non_finite / scale_", all, norm_check},
  };
}

}  // namespace scalelab::kernels::selftest
