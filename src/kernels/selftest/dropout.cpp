// Checks of the dropout family (see kernels/selftest.h for how a check works).
//
// Tolerance 0 for every dtype: the masks come from the same counter-based generator on every
// backend, and a kept element is one fp32 product rounded once, so the outputs must be identical
// bit for bit (inputs are never zero, so a wrong mask bit always shows). Element counts that are
// not a multiple of 4 check the last, partial Philox block; keys with a large step and layer check
// the counter words above 32 bits.
#include <cstdint>

#include "kernels/dropout.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr Tolerance kExact{0.0, 0.0, 0.0};

std::vector<CheckResult> dropout_check(const CheckEnv& env, DType dt, float p, const DropoutKey& key) {
  ExecContext host{env.host, nullptr}, dev{env.device, nullptr};
  const std::int64_t n = 64 * 96 + 3;
  const Tensor x0 = random_tensor({n}, dt, *env.host, env.seed * 1000003u + 1, 0.25f, 1.0f);
  const Tensor dy = random_tensor({n}, dt, *env.host, env.seed * 1000003u + 2, -1.0f, -0.25f);
  // Forward, in place.
  Tensor x = x0.to(*env.host);
  dropout_forward(x, p, key, host);
  Tensor xd = to_device(x0, *env.device);
  dropout_forward(xd, p, key, dev);
  // Backward into a fresh dx, and in place over dy.
  Tensor dx = poisoned({n}, dt, *env.host);
  dropout_backward(dx, dy, p, key, host);
  Tensor dxd = poisoned({n}, dt, *env.device);
  const Tensor dyd = to_device(dy, *env.device);
  dropout_backward(dxd, dyd, p, key, dev);
  Tensor di = dy.to(*env.host);
  dropout_backward(di, di, p, key, host);
  Tensor did = to_device(dy, *env.device);
  dropout_backward(did, did, p, key, dev);
  return {compare("x (forward, in place)", xd, x, kExact, dt), compare("dx", dxd, dx, kExact, dt),
          compare("dx (over dy)", did, di, kExact, dt)};
}

}  // namespace

std::vector<OpCheck> dropout_checks() {
  return {
      {"dropout", "dropout p=0.1", kAll,
       [](const CheckEnv& env, DType dt) { return dropout_check(env, dt, 0.1f, {env.seed, 3, 1, 2}); }},
      {"dropout", "dropout p=0.5 (large step and layer)", kAll,
       [](const CheckEnv& env, DType dt) {
         return dropout_check(env, dt, 0.5f, {env.seed ^ 0x9E3779B97F4A7C15ull, (std::int64_t{1} << 33) + 7, 300, 15});
       }},
      {"dropout", "dropout p=0 (identity)", kAll,
       [](const CheckEnv& env, DType dt) { return dropout_check(env, dt, 0.0f, {env.seed, 1, 0, 0}); }},
  };
}

}  // namespace scalelab::kernels::selftest
