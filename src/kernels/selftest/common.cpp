#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/loss.h"
#include "kernels/selftest.h"

namespace scalelab::kernels::selftest {

Tensor random_tensor(const Shape& shape, DType dtype, DeviceAllocator& host, std::uint64_t seed, float lo, float hi) {
  SCALELAB_CHECK(host.device() == DeviceType::kCPU, "[selftest] random_tensor draws on the host allocator");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(shape.numel()));
  for (auto& x : v) x = dist(rng);
  Tensor t = Tensor::empty(shape, dtype, host, "selftest input");
  convert(v.data(), DType::kF32, t.raw(), dtype, v.size());
  return t;
}

Tensor random_ids(const Shape& shape, std::int64_t n, DeviceAllocator& host, std::uint64_t seed, double ignore) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, n - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Tensor t = Tensor::empty(shape, DType::kI32, host, "selftest ids");
  auto* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    p[i] = (ignore > 0 && u(rng) < ignore) ? kIgnoreIndex : static_cast<std::int32_t>(dist(rng));
  }
  return t;
}

Tensor to_device(const Tensor& host_tensor, DeviceAllocator& device) { return host_tensor.to(device, "selftest"); }

Tensor poisoned(const Shape& shape, DType dtype, DeviceAllocator& alloc) {
  Tensor t = Tensor::empty(shape, dtype, alloc, "selftest output");
  const std::size_t n = static_cast<std::size_t>(t.numel());
  std::vector<char> bytes(t.nbytes());
  if (dtype == DType::kI32) {
    std::vector<std::int32_t> v(n, std::numeric_limits<std::int32_t>::min());
    std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    std::vector<float> v(n, std::numeric_limits<float>::quiet_NaN());
    convert(v.data(), DType::kF32, bytes.data(), dtype, n);
  }
  t.copy_from_host(bytes.data());
  return t;
}

double rel_error(const Tensor& out, const Tensor& ref) {
  if (out.numel() != ref.numel()) return std::numeric_limits<double>::infinity();
  const std::size_t n = static_cast<std::size_t>(out.numel());
  auto host_f32 = [n](const Tensor& t) {
    std::vector<char> raw(t.nbytes());
    t.copy_to_host(raw.data());
    std::vector<float> f(n);
    if (t.dtype() == DType::kI32) {
      const auto* p = reinterpret_cast<const std::int32_t*>(raw.data());
      for (std::size_t i = 0; i < n; ++i) f[i] = static_cast<float>(p[i]);
    } else {
      convert(raw.data(), t.dtype(), f.data(), DType::kF32, n);
    }
    return f;
  };
  const std::vector<float> a = host_f32(out), b = host_f32(ref);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double bits_differing(const Tensor& out, const Tensor& ref) {
  if (out.numel() != ref.numel() || out.dtype() != ref.dtype()) return std::numeric_limits<double>::infinity();
  std::vector<unsigned char> a(out.nbytes()), b(ref.nbytes());
  out.copy_to_host(a.data());
  ref.copy_to_host(b.data());
  const std::size_t width = dtype_size(out.dtype());
  double differing = 0;
  for (std::size_t i = 0; i < a.size(); i += width) differing += std::memcmp(&a[i], &b[i], width) != 0 ? 1 : 0;
  return differing;
}

CheckResult compare(const char* output, const Tensor& out, const Tensor& ref, const Tolerance& tol, DType dtype) {
  return {output, rel_error(out, ref), tol.for_dtype(dtype)};
}

}  // namespace scalelab::kernels::selftest
