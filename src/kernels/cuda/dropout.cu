// Dropout on CUDA (kernels/dropout.h) with the CPU's masks bit for bit (cpu/dropout.cpp): element i
// of a call keyed by (seed, step, layer, site) is kept when word (i mod 4) of
//   Philox4x32-10(counter = (uint32(i / 4), uint32(layer·16 + site), uint32(step), uint32(step >> 32)),
//                 key = (uint32(seed), uint32(seed >> 32)))
// is >= round(p · 2^32) (saturated at 2^32 − 1). One thread per block of four elements computes
// one Philox block; kept elements are scaled by 1 / (1 − p) (fp32, computed on the host as the
// CPU does), dropped ones are 0. In place (forward) or dx = dy · mask · scale (dx may alias dy:
// each element is read before the same thread writes it). p = 0 copies (or does nothing in place).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {

__host__ __device__ __forceinline__ std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
}

// core/philox.cpp philox4x32_10, on the device: the same rounds, constants and key schedule.
__host__ __device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k.x += kW0;
      k.y += kW1;
    }
    const std::uint32_t hi0 = mulhi32(kM0, c.x), lo0 = kM0 * c.x;
    const std::uint32_t hi1 = mulhi32(kM1, c.z), lo1 = kM1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

// The CPU's threshold(p): round(p · 2^32) in double, saturated.
std::uint32_t threshold(float p) {
  const double t = std::round(static_cast<double>(p) * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

struct DropoutApply {
  Out dst;
  In src;
  std::int64_t n;
  std::uint32_t layer_site, step_lo, step_hi, seed_lo, seed_hi, thr;
  float scale;
  __device__ void operator()(std::int64_t j) const {  // j: block of four elements
    const uint4 r = philox4x32_10(make_uint4(static_cast<std::uint32_t>(j), layer_site, step_lo, step_hi),
                                  make_uint2(seed_lo, seed_hi));
    const std::uint32_t words[4] = {r.x, r.y, r.z, r.w};
    const std::int64_t i0 = j * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::int64_t i = i0 + k;
      if (i >= n) break;
      const float v = src[i];
      dst.set(i, words[k] >= thr ? __fmul_rn(v, scale) : 0.0f);
    }
  }
};

void check_args(float p, const DropoutKey& key, const char* op) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw InvalidInput(std::string("[") + op + "] dropout probability must be in [0, 1), got " + std::to_string(p));
  }
  SCALELAB_CHECK(key.site >= 0 && key.site < 16, std::string("[") + op + "] dropout site must be in 0..15");
}

void apply(Tensor& dst, const Tensor& src, float p, const DropoutKey& key, const char* op) {
  check_args(p, key, op);
  const std::int64_t n = src.numel();
  require_numel(dst, n, op, "output");
  if (p == 0.0f) {
    if (dst.raw() != src.raw() || dst.dtype() != src.dtype()) dst.copy_from(src);
    return;
  }
  if (n == 0) return;
  const auto layer_site = static_cast<std::uint64_t>(key.layer) * 16 + static_cast<std::uint64_t>(key.site);
  const auto step = static_cast<std::uint64_t>(key.step);
  DropoutApply f{out_of(dst),
                 in_of(src),
                 n,
                 static_cast<std::uint32_t>(layer_site),
                 static_cast<std::uint32_t>(step),
                 static_cast<std::uint32_t>(step >> 32),
                 static_cast<std::uint32_t>(key.seed),
                 static_cast<std::uint32_t>(key.seed >> 32),
                 threshold(p),
                 1.0f / (1.0f - p)};
  launch_map(f, (n + 3) / 4, op);
}

}  // namespace

void CudaBackend::dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx) {
  apply(x, x, p, key, "dropout_forward");
}

void CudaBackend::dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext& ctx) {
  apply(dx, dy, p, key, "dropout_backward");
}

}  // namespace scalelab::kernels::cuda
