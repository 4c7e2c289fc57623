#pragma once
// Op checks any backend runs: each op family, forward and backward, on fresh random inputs, on a
// device against the CPU reference, with the tolerance of each dtype written beside the check.
//
// `scalelab selftest --device cuda` runs them from the installed binary (a user's first command
// on a new cluster); tests/kernels/device_ops_test.cpp runs them as a GoogleTest suite
// parameterized over device x dtype (skipping, with one message, a device that is absent).
//
// How a check works (src/kernels/selftest/<family>.cpp): draw inputs on the host with
// random_tensor (never zeros), run the op through its front on CPU copies (the reference) and on
// device copies (to_device), the device's outputs poisoned with NaN first (poisoned) so that an
// unwritten element fails, and compare each output with rel_error (‖out − ref‖ / ‖ref‖ in
// double; NaN or inf anywhere is +inf). One CheckResult per compared output.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"

namespace scalelab::kernels::selftest {

struct CheckResult {
  std::string output;      // which output, e.g. "y", "dx", "dw"
  double rel_error = 0;    // ‖out − ref‖ / ‖ref‖
  double tolerance = 0;    // from the check's table for this dtype
  bool passed() const { return rel_error <= tolerance; }
};

// Tolerances per storage dtype of the activations (compute is fp32 everywhere).
struct Tolerance {
  double f32 = 1e-5, bf16 = 1e-2, f16 = 2e-3;
  double for_dtype(DType t) const { return t == DType::kBF16 ? bf16 : t == DType::kF16 ? f16 : f32; }
};

// The two allocators a check uses: the host (reference) and the device under test.
struct CheckEnv {
  DeviceAllocator* host = nullptr;
  DeviceAllocator* device = nullptr;
  std::uint64_t seed = 1;
};

struct OpCheck {
  std::string family;  // "norm", "matmul", ...
  std::string name;    // "rmsnorm", "linear (bias)", ...
  std::vector<DType> dtypes;
  std::function<std::vector<CheckResult>(const CheckEnv& env, DType dtype)> run;
};

// Every family's checks (selftest/registry.cpp lists the families).
const std::vector<OpCheck>& all_op_checks();

// --- helpers for writing checks
// Uniform values in [lo, hi) from `seed`, stored in dtype, on the host allocator.
Tensor random_tensor(const Shape& shape, DType dtype, DeviceAllocator& host, std::uint64_t seed, float lo = -1.0f,
                     float hi = 1.0f);
// Random int32 token ids in [0, n) (a fraction `ignore` of them kIgnoreIndex, for targets).
Tensor random_ids(const Shape& shape, std::int64_t n, DeviceAllocator& host, std::uint64_t seed, double ignore = 0.0);
// A copy of a host tensor on `device`.
Tensor to_device(const Tensor& host_tensor, DeviceAllocator& device);
// A tensor on `alloc` whose every element is NaN (fp types) or INT32_MIN (int32).
Tensor poisoned(const Shape& shape, DType dtype, DeviceAllocator& alloc);
// ‖out − ref‖ / ‖ref‖ in double over all elements, out on any device; +inf when any element of
// out is NaN/inf or the shapes differ; the plain ‖out‖ when ‖ref‖ is 0.
double rel_error(const Tensor& out, const Tensor& ref);
CheckResult compare(const char* output, const Tensor& out, const Tensor& ref, const Tolerance& tol, DType dtype);
// For kernels that claim the CPU's bits: the number of elements of out whose stored bits differ
// from ref's (a NaN-poisoned element that was never written counts; +0 and -0 differ); +inf when
// the dtypes or element counts differ. Its CheckResult's tolerance is 0.
double bits_differing(const Tensor& out, const Tensor& ref);

}  // namespace scalelab::kernels::selftest
