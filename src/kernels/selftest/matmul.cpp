// Checks of the matmul family (see kernels/selftest.h for how a check works).
//
// Tolerances (relative, ‖out − ref‖ / ‖ref‖), from the Tolerance defaults:
//   fp32 1e-5: both sides accumulate in fp32; a dot product of length k has a rounding error of
//              about sqrt(k)·2^-24 relative in practice (k <= 96 here: ~6e-7; even k = 8192 stays
//              near 5e-6), and the summation orders of OpenBLAS and cuBLASLt differ only in that.
//   bf16 1e-2, fp16 2e-3: inputs are the same stored values on both sides and the products are
//              fp32, so what differs is the final rounding into the storage type (half an ulp,
//              2^-9 / 2^-12 relative, on the few elements whose fp32 values straddle a rounding
//              boundary) and, for the bias, the CPU's second rounding after adding it.
#include <string>

#include "core/context.h"
#include "kernels/matmul.h"
#include "kernels/selftest/families.h"

namespace scalelab::kernels::selftest {

namespace {

constexpr std::int64_t kT = 64, kIn = 96, kOut = 80;

ExecContext context_on(DeviceAllocator* alloc) {
  ExecContext ctx;
  ctx.alloc = alloc;
  return ctx;
}

// A copy on the same allocator (accumulated outputs start from the same values on both sides).
Tensor copy_on(const Tensor& t, DeviceAllocator& alloc) { return t.to(alloc, "selftest copy"); }

// y = x·wᵀ (+ b), then dx (assigned, or accumulated), dw += dyᵀ·x, db += Σ dy.
// act: dtype of x, y, dy, dx; wt: dtype of w, b, dw, db (differs for the mixed check).
std::vector<CheckResult> linear_check(const CheckEnv& env, DType act, DType wt, bool bias, bool accumulate_dx) {
  const Tolerance tol;
  const DType tol_dtype = act == DType::kF32 ? wt : act;
  DeviceAllocator& host = *env.host;
  DeviceAllocator& dev = *env.device;
  ExecContext hc = context_on(env.host), dc = context_on(env.device);
  const std::uint64_t s = env.seed;

  const Tensor x = random_tensor({kT, kIn}, act, host, s + 1);
  const Tensor w = random_tensor({kOut, kIn}, wt, host, s + 2);
  const Tensor b = bias ? random_tensor({kOut}, wt, host, s + 3) : Tensor();
  const Tensor dy = random_tensor({kT, kOut}, act, host, s + 4);
  const Tensor dw0 = random_tensor({kOut, kIn}, wt, host, s + 5);
  const Tensor db0 = bias ? random_tensor({kOut}, wt, host, s + 6) : Tensor();
  const Tensor dx0 = random_tensor({kT, kIn}, act, host, s + 7);
  const Tensor xd = to_device(x, dev), wd = to_device(w, dev), dyd = to_device(dy, dev);
  const Tensor bd = bias ? to_device(b, dev) : Tensor();

  std::vector<CheckResult> out;
  // Forward.
  Tensor y_ref = Tensor::empty({kT, kOut}, act, host, "selftest ref");
  linear_forward(y_ref, x, w, bias ? &b : nullptr, hc);
  Tensor y_dev = poisoned({kT, kOut}, act, dev);
  linear_forward(y_dev, xd, wd, bias ? &bd : nullptr, dc);
  out.push_back(compare("y", y_dev, y_ref, tol, tol_dtype));

  // Backward: dw and db accumulate, so both sides start from the same random values (a poisoned
  // start would only test NaN propagation); dx is poisoned unless it accumulates.
  Tensor dx_ref = accumulate_dx ? copy_on(dx0, host) : Tensor::empty({kT, kIn}, act, host, "selftest ref");
  Tensor dx_dev = accumulate_dx ? to_device(dx0, dev) : poisoned({kT, kIn}, act, dev);
  Tensor dw_ref = copy_on(dw0, host), dw_dev = to_device(dw0, dev);
  Tensor db_ref = bias ? copy_on(db0, host) : Tensor(), db_dev = bias ? to_device(db0, dev) : Tensor();
  linear_backward(&dx_ref, dw_ref, bias ? &db_ref : nullptr, dy, x, w, hc, accumulate_dx);
  linear_backward(&dx_dev, dw_dev, bias ? &db_dev : nullptr, dyd, xd, wd, dc, accumulate_dx);
  out.push_back(compare("dx", dx_dev, dx_ref, tol, tol_dtype));
  out.push_back(compare("dw", dw_dev, dw_ref, tol, tol_dtype));
  if (bias) out.push_back(compare("db", db_dev, db_ref, tol, tol_dtype));
  return out;
}

// gemm_ex on sub-matrices of larger buffers (leading dimensions wider than the rows, operands at
// an element offset) for every transpose combination, alpha/beta != 1, accumulating into C.
std::vector<CheckResult> gemm_ex_check(const CheckEnv& env, DType dt) {
  const Tolerance tol;
  DeviceAllocator& host = *env.host;
  DeviceAllocator& dev = *env.device;
  ExecContext hc = context_on(env.host), dc = context_on(env.device);
  const std::int64_t m = 37, n = 45, k = 70, pad = 3, off = 5;
  std::vector<CheckResult> out;
  int variant = 0;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::uint64_t s = env.seed + 100 + 10 * static_cast<std::uint64_t>(variant++);
      const std::int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
      const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
      const Tensor a = random_tensor({off + a_rows * lda}, dt, host, s + 1);
      const Tensor b = random_tensor({off + b_rows * ldb}, dt, host, s + 2);
      const Tensor c0 = random_tensor({off + m * ldc}, dt, host, s + 3);
      Tensor c_ref = copy_on(c0, host);
      const Tensor ad = to_device(a, dev), bd = to_device(b, dev);
      Tensor c_dev = to_device(c0, dev);
      const std::size_t es = dtype_size(dt), o = static_cast<std::size_t>(off) * es;
      const float alpha = 0.75f, beta = -0.5f;
      gemm_ex(ta, tb, m, n, k, alpha, static_cast<const char*>(a.raw()) + o, dt, lda,
              static_cast<const char*>(b.raw()) + o, dt, ldb, beta, static_cast<char*>(c_ref.raw()) + o, dt, ldc, hc);
      gemm_ex(ta, tb, m, n, k, alpha, static_cast<const char*>(ad.raw()) + o, dt, lda,
              static_cast<const char*>(bd.raw()) + o, dt, ldb, beta, static_cast<char*>(c_dev.raw()) + o, dt, ldc,
              dc);
      // The padding columns and the offset must be untouched: compared as part of the buffer.
      const std::string name = std::string("C (") + (ta ? "A^T" : "A") + "·" + (tb ? "B^T" : "B") + ")";
      CheckResult r = compare("C", c_dev, c_ref, tol, dt);
      r.output = name;
      out.push_back(r);
    }
  }
  // Mixed operand types into an fp32 C (the widening path): A in dt, B fp32, C fp32.
  {
    const Tensor a = random_tensor({m, k}, dt, host, env.seed + 201);
    const Tensor b = random_tensor({k, n}, DType::kF32, host, env.seed + 202);
    const Tensor c0 = random_tensor({m, n}, DType::kF32, host, env.seed + 203);
    Tensor c_ref = copy_on(c0, host), c_dev = to_device(c0, dev);
    const Tensor ad = to_device(a, dev), bd = to_device(b, dev);
    gemm_ex(false, false, m, n, k, 1.0f, a.raw(), dt, k, b.raw(), DType::kF32, n, 1.0f, c_ref.raw(), DType::kF32, n,
            hc);
    gemm_ex(false, false, m, n, k, 1.0f, ad.raw(), dt, k, bd.raw(), DType::kF32, n, 1.0f, c_dev.raw(), DType::kF32, n,
            dc);
    // C is fp32 and the widening is exact: the fp32 tolerance holds for every dt.
    out.push_back(compare("C (mixed A/B dtypes, fp32 C)", c_dev, c_ref, tol, DType::kF32));
  }
  return out;
}

}  // namespace

std::vector<OpCheck> matmul_checks() {
  const std::vector<DType> all = {DType::kF32, DType::kBF16, DType::kF16};
  std::vector<OpCheck> checks;
  checks.push_back({"matmul", "linear", all, [](const CheckEnv& env, DType dt) {
                      return linear_check(env, dt, dt, /*bias=*/false, /*accumulate_dx=*/false);
                    }});
  checks.push_back({"matmul", "linear (bias)", all, [](const CheckEnv& env, DType dt) {
                      return linear_check(env, dt, dt, /*bias=*/true, /*accumulate_dx=*/false);
                    }});
  checks.push_back({"matmul", "linear (accumulated dx)", all, [](const CheckEnv& env, DType dt) {
                      return linear_check(env, dt, dt, /*bias=*/true, /*accumulate_dx=*/true);
                    }});
  // Low-precision activations with fp32 weights and weight gradients (operands of two dtypes).
  checks.push_back({"matmul", "linear (fp32 weights)", {DType::kBF16, DType::kF16}, [](const CheckEnv& env, DType dt) {
                      return linear_check(env, dt, DType::kF32, /*bias=*/true, /*accumulate_dx=*/false);
                    }});
  checks.push_back({"matmul", "gemm_ex", all, gemm_ex_check});
  return checks;
}

}  // namespace scalelab::kernels::selftest
