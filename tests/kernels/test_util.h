#pragma once
// Helpers for kernel tests: random tensors, a CPU context, and the finite-difference gradient check.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/context.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace scalelab::test {

struct Cpu {
  std::unique_ptr<DeviceAllocator> alloc = std::make_unique<DeviceAllocator>(make_host_backend(), std::size_t{1} << 32);
  ExecContext ctx{alloc.get(), nullptr};
  Tensor randn(const Shape& s, float stddev, std::uint32_t seed) {
    Tensor t = Tensor::empty(s, DType::kF32, *alloc);
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, stddev);
    float* p = t.f32();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
    return t;
  }
  Tensor zeros(const Shape& s) { return Tensor::zeros(s, DType::kF32, *alloc); }
  Tensor ids(const std::vector<std::int32_t>& v) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::kI32, *alloc);
    for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int32_t>()[i] = v[i];
    return t;
  }
};

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a.f32()[i]) * b.f32()[i];
  return s;
}

// Compares `analytic` (the gradient of L w.r.t. x) with central differences of `loss` (which
// reads x) at up to `samples` positions spread over x. |num − ana| <= atol + rtol·|num|.
inline void expect_grad_close(Tensor& x, const Tensor& analytic, const std::function<double()>& loss,
                              const char* what, double h = 1e-2, double atol = 2e-3, double rtol = 2e-2,
                              int samples = 64) {
  ASSERT_EQ(x.numel(), analytic.numel()) << what;
  float* xp = x.f32();
  const std::int64_t n = x.numel();
  const std::int64_t stride = std::max<std::int64_t>(1, n / samples);
  int checked = 0;
  for (std::int64_t i = (n > samples ? 7 % stride : 0); i < n; i += stride) {
    const float orig = xp[i];
    xp[i] = static_cast<float>(orig + h);
    const double lp = loss();
    xp[i] = static_cast<float>(orig - h);
    const double lm = loss();
    xp[i] = orig;
    const double num = (lp - lm) / (2 * h);
    const double ana = analytic.f32()[i];
    EXPECT_NEAR(ana, num, atol + rtol * std::fabs(num)) << what << " element " << i;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// A copy of t on c's allocator.
inline Tensor clone(Cpu& c, const Tensor& t) {
  Tensor o = Tensor::empty(t.shape(), t.dtype(), *c.alloc);
  o.copy_from(t);
  return o;
}

// fp32 tensors equal element by element within atol + rtol·|want| (the first 5 misses reported).
inline void expect_close(const Tensor& got, const Tensor& want, const char* what, double rtol = 1e-5,
                         double atol = 1e-6) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  int bad = 0;
  for (std::int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    const double g = got.f32()[i], w = want.f32()[i];
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      ADD_FAILURE() << what << " element " << i << ": " << g << " vs " << w;
      ++bad;
    }
  }
}

}  // namespace scalelab::test
