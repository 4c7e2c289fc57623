// Checks of the qat family (kernels/qat.h): QAT's fake quantization, forward and straight-through
// backward, of activations (int8 per token) and weights (int4 per group), every dtype.
//
// Tolerance: 0 elements whose bits differ from the CPU's, in every dtype. The CUDA kernels
// (cuda/qat.cu) and the CPU (cpu/qat.cpp) evaluate the same scalar steps (qat_math.h): the
// minimum and maximum of a run (exact in any order; the clamps against +0 erase the sign of a
// zero), then one IEEE fp32 operation at a time with no multiply feeding an add (nothing for an
// FMA contraction to fuse; nvcc is not given --use_fast_math, so the divisions are IEEE), and
// bf16 / fp16 storage is loaded exactly and rounded to nearest even per stored element on both
// sides; for bf16 / fp16 tensors the intermediate roundings of torchao's arithmetic in that dtype
// (the scale and zero point, the STE's two products: qat_math.h's `stored`) are round-to-nearest-
// even on both sides too (core/dtype.h's conversions and AVX2 bit arithmetic / F16C on the CPU,
// __float2bfloat16_rn / __float2half_rn on the GPU). So every stored bit is the CPU's, including the sign of zeros and the elements
// whose gradient the clamp mask drops. Outputs "NAME (bits)": the "rel error" column of these
// rows is the number of elements whose bits differ (a NaN-poisoned element never written counts).
//
// Inputs: random values (rows and groups whose lengths are not multiples of the 32 lanes of a
// warp or the 8 of an AVX2 vector, rows shorter than a warp, more rows than one block's warps),
// and "ties" rows and groups built so that x / scale lands exactly on k + 1/2 for many elements:
// round-half-to-even and the clamp bounds are where a different rounding would show.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/qat.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

CheckResult bits(const std::string& output, const Tensor& out, const Tensor& ref) {
  return {output + " (bits)", bits_differing(out, ref), 0.0};
}

Tensor from_values(const std::vector<float>& v, const Shape& s, DType dt, DeviceAllocator& host) {
  Tensor t = Tensor::empty(s, dt, host, "selftest input");
  convert(v.data(), DType::kF32, t.raw(), dt, v.size());
  return t;
}

// Activation rows whose scale is exactly 1/64 and zero point 0: each row holds −2 and 127/64 (its
// minimum and maximum: s = (127/64 + 2) / 255 = 1/64), the rest m/128 for integers m in
// [−255, 253], so x / s = m / 2 (a tie for odd m). Exact in bf16 and fp16 (at most 8 significant bits).
Tensor per_token_ties(std::int64_t rows, std::int64_t n, DType dt, DeviceAllocator& host, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> m(-255, 253);
  std::vector<float> v(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(r * n + i)] = static_cast<float>(m(rng)) / 128.0f;
    // The extremes at a row-dependent place (not always the first lanes).
    v[static_cast<std::size_t>(r * n + (r * 7) % n)] = -2.0f;
    v[static_cast<std::size_t>(r * n + (r * 7 + 1 + r % (n - 1)) % n)] = 127.0f / 64.0f;
  }
  return from_values(v, {rows, n}, dt, host);
}

// Weight groups whose scale is exactly 1/16: each group holds ±15/32 (its largest magnitude:
// s = (15/32) / 7.5 = 1/16), the rest m/32 for integers m in [−15, 15], so w / s = m / 2.
Tensor group_ties(std::int64_t rows, std::int64_t cols, std::int64_t group, DType dt, DeviceAllocator& host,
                  std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> m(-15, 15);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (auto& x : v) x = static_cast<float>(m(rng)) / 32.0f;
  for (std::int64_t g = 0; g < rows * cols / group; ++g) {
    v[static_cast<std::size_t>(g * group + (g * 5) % group)] = (g % 2 ? -15.0f : 15.0f) / 32.0f;
  }
  return from_values(v, {rows, cols}, dt, host);
}

// Forward, backward assigned and backward accumulated, of activations x.
std::vector<CheckResult> per_token_check(const CheckEnv& env, DType dt, const Tensor& x) {
  const Sides s(env);
  const Shape& sh = x.shape();
  const Tensor dy = s.rnd(sh, dt, 11), dx0 = s.rnd(sh, dt, 12);
  const Tensor xd = s.on_dev(x), dyd = s.on_dev(dy);
  ExecContext hc = s.host, dc = s.dev;
  std::vector<CheckResult> out;

  Tensor y = s.host_out(sh, dt), yd = s.dev_out(sh, dt);
  fake_quant_per_token_forward(y, x, hc);
  fake_quant_per_token_forward(yd, xd, dc);
  out.push_back(bits("y", yd, y));

  Tensor dx = s.host_out(sh, dt), dxd = s.dev_out(sh, dt);
  fake_quant_per_token_backward(dx, dy, x, /*accumulate=*/false, hc);
  fake_quant_per_token_backward(dxd, dyd, xd, false, dc);
  out.push_back(bits("dx", dxd, dx));

  Tensor dxa = s.host_copy(dx0), dxad = s.on_dev(dx0);
  fake_quant_per_token_backward(dxa, dy, x, /*accumulate=*/true, hc);
  fake_quant_per_token_backward(dxad, dyd, xd, true, dc);
  out.push_back(bits("dx+=", dxad, dxa));
  return out;
}

// Forward and backward (accumulated into dw, as the parameter gradient is) of weight w.
std::vector<CheckResult> group_check(const CheckEnv& env, DType dt, const Tensor& w, std::int64_t group) {
  const Sides s(env);
  const Shape& sh = w.shape();
  const Tensor g = s.rnd(sh, dt, 21), dw0 = s.rnd(sh, dt, 22);
  const Tensor wd = s.on_dev(w), gd = s.on_dev(g);
  ExecContext hc = s.host, dc = s.dev;
  std::vector<CheckResult> out;

  Tensor wq = s.host_out(sh, dt), wqd = s.dev_out(sh, dt);
  fake_quant_group_forward(wq, w, group, hc);
  fake_quant_group_forward(wqd, wd, group, dc);
  out.push_back(bits("wq", wqd, wq));

  Tensor dw = s.host_copy(dw0), dwd = s.on_dev(dw0);
  fake_quant_group_backward(dw, g, w, group, hc);
  fake_quant_group_backward(dwd, gd, wd, group, dc);
  out.push_back(bits("dw+=", dwd, dw));
  return out;
}

OpCheck per_token(const char* name, Shape shape, bool ties) {
  return {"qat", name, kAll, [shape, ties](const CheckEnv& env, DType dt) {
            const Sides s(env);
            const Tensor x = ties ? per_token_ties(shape[0], shape[1], dt, *env.host, env.seed * 1000003u + 1)
                                  : s.rnd(shape, dt, 1, -3.0f, 2.0f);  // lopsided: a zero point != 0
            return per_token_check(env, dt, x);
          }};
}

OpCheck group(const char* name, std::int64_t rows, std::int64_t cols, std::int64_t group_size, bool ties) {
  return {"qat", name, kAll, [=](const CheckEnv& env, DType dt) {
            const Sides s(env);
            const Tensor w = ties ? group_ties(rows, cols, group_size, dt, *env.host, env.seed * 1000003u + 2)
                                  : s.rnd({rows, cols}, dt, 2, -0.1f, 0.1f);
            return group_check(env, dt, w, group_size);
          }};
}

}  // namespace

std::vector<OpCheck> qat_checks() {
  return {
      // [2, 37, 77]: 74 rows (more than a block's 8 warps) of 77 (not a multiple of 32 or 8).
      per_token("fake_quant_per_token (rows of 77)", {2, 37, 77}, false),
      per_token("fake_quant_per_token (rows of 5)", {9, 5}, false),      // shorter than a warp
      per_token("fake_quant_per_token (rows of 300)", {3, 300}, false),  // several strides of a warp
      per_token("fake_quant_per_token (ties)", {11, 96}, true),
      // --qat-group-size 32 and 256 (torchao's default); rows not a multiple of 8.
      group("fake_quant_group (group 32)", 67, 96, 32, false),
      group("fake_quant_group (group 256)", 13, 512, 256, false),
      group("fake_quant_group (group 32, ties)", 9, 64, 32, true),
  };
}

}  // namespace scalelab::kernels::selftest
