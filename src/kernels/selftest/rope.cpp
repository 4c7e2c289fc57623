// Checks of the rope family (see kernels/selftest.h for how a check works): the rotation in place
// on the Q and K heads of a packed qkv buffer, forward and backward (the inverse rotation).
//
// Tolerances: the defaults of Tolerance (fp32 1e-5, bf16 1e-2, fp16 2e-3): two products and a sum
// per element from the same cos/sin table. The whole buffer is compared, so columns outside the
// rotated heads (V here) must come back untouched.
#include <cstdint>
#include <optional>

#include "kernels/rope.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {


// qkv rows of 4 query heads, 2 key heads and 2 value heads of 16; 4 sequences of 16 tokens.
std::vector<CheckResult> rope_check(const CheckEnv& env, DType dt, bool llama3_scaling) {
  const Tolerance tol;
  ExecContext host{env.host, nullptr}, dev{env.device, nullptr};
  const std::int64_t nq = 4, nkv = 2, hd = 16, ld = (nq + 2 * nkv) * hd, seq = 16, rows = 64;
  std::optional<RopeScaling> scaling;
  if (llama3_scaling) {
    RopeScaling r;
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_max_position_embeddings = 8;
    scaling = r;
  }
  const RopeTable table = make_rope_table(hd, 32, 10000.0, scaling);
  const Tensor x0 = random_tensor({rows, ld}, dt, *env.host, env.seed * 1000003u + 1);
  std::vector<CheckResult> out;
  for (bool backward : {false, true}) {
    Tensor x = x0.to(*env.host);
    Tensor xd = to_device(x0, *env.device);
    if (backward) {
      rope_backward(x, 0, ld, nq, hd, seq, table, host);
      rope_backward(x, nq * hd, ld, nkv, hd, seq, table, host);
      rope_backward(xd, 0, ld, nq, hd, seq, table, dev);
      rope_backward(xd, nq * hd, ld, nkv, hd, seq, table, dev);
    } else {
      rope_forward(x, 0, ld, nq, hd, seq, table, host);
      rope_forward(x, nq * hd, ld, nkv, hd, seq, table, host);
      rope_forward(xd, 0, ld, nq, hd, seq, table, dev);
      rope_forward(xd, nq * hd, ld, nkv, hd, seq, table, dev);
    }
    out.push_back(compare(backward ? "dqkv (backward)" : "qkv (forward)", xd, x, tol, dt));
  }
  return out;
}

}  // namespace

std::vector<OpCheck> rope_checks() {
  return {
      {"rope", "rope", kAll, [](const CheckEnv& env, DType dt) { return rope_check(env, dt, false); }},
      {"rope", "rope (llama3 scaling)", kAll, [](const CheckEnv& env, DType dt) { return rope_check(env, dt, true); }},
  };
}

}  // namespace scalelab::kernels::selftest
