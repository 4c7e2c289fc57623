// AdamW and the gradient reductions on the CPU (adamw.h).
#include "kernels/adamw.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels {

namespace {

constexpr std::int64_t kChunk = 1 << 12;

std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// The fp32 update of n elements; restrict pointers let the compiler vectorize it.
void adamw_f32(float* __restrict p, float* __restrict m, float* __restrict v, const float* __restrict g,
               std::int64_t n, float gs, float b1, float b2, float step_size, float bc2_sqrt, float eps, float decay) {
  const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + omb1 * gi;
    const float vi = b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

}  // namespace

std::uint32_t rounding_bits(std::uint64_t seed, std::int64_t step, std::int64_t index) {
  return static_cast<std::uint32_t>(mix64(seed ^ mix64(static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ull +
                                                       static_cast<std::uint64_t>(index))) & 0xffffu);
}

bf16 stochastic_round_bf16(float x, std::uint32_t random16) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return float_to_bf16(x);  // inf / NaN
  u += random16 & 0xffffu;
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

namespace cpu {

void CpuBackend::adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads,
                              const std::vector<ElementRange>& ranges, const AdamWHyper& hp, ExecContext&) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = hp.beta1, b2 = hp.beta2, omb1 = 1.0f - hp.beta1, omb2 = 1.0f - hp.beta2, eps = hp.eps;
  const float gs = hp.grad_scale;
  const DType pt = params.dtype(), mt = m.dtype(), vt = v.dtype(), gt = grads.dtype();
  const bool all_f32 = pt == DType::kF32 && mt == DType::kF32 && vt == DType::kF32 && gt == DType::kF32;
  for (const auto& r : ranges) {
    const float decay = r.decay ? 1.0f - hp.lr * hp.weight_decay : 1.0f;
    if (all_f32) {
      float* p = params.f32();
      float* mp = m.f32();
      float* vp = v.f32();
      const float* g = grads.f32();
      parallel_for(r.end - r.begin, 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
        const std::int64_t b = r.begin + i0;
        adamw_f32(p + b, mp + b, vp + b, g + b, i1 - i0, gs, b1, b2, step_size, bc2_sqrt, eps, decay);
      });
      continue;
    }
    const std::int64_t len = r.end - r.begin, chunks = (len + kChunk - 1) / kChunk;
    parallel_for(chunks, 2, [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t b = r.begin + c * kChunk, e = std::min(r.end, b + kChunk), k = e - b;
        float* p = inout_row(elem(params.raw(), pt, b), pt, k, 0);
        float* mp = inout_row(elem(m.raw(), mt, b), mt, k, 1);
        float* vp = inout_row(elem(v.raw(), vt, b), vt, k, 2);
        const float* g = load_row(elem(grads.raw(), gt, b), gt, k, 3);
        for (std::int64_t i = 0; i < k; ++i) {
          const float gi = g[i] * gs;
          const float mi = b1 * mp[i] + omb1 * gi;
          const float vi = b2 * vp[i] + omb2 * gi * gi;
          mp[i] = mi;
          vp[i] = vi;
          const float denom = std::sqrt(vi) / bc2_sqrt + eps;
          p[i] = p[i] * decay - step_size * (mi / denom);
        }
        store_row(mp, elem(m.raw(), mt, b), mt, k);
        store_row(vp, elem(v.raw(), vt, b), vt, k);
        if (pt == DType::kBF16) {
          bf16* dst = static_cast<bf16*>(elem(params.raw(), pt, b));
          for (std::int64_t i = 0; i < k; ++i) dst[i] = stochastic_round_bf16(p[i], rounding_bits(hp.rounding_seed, hp.step, hp.index_base + b + i));
        } else {
          store_row(p, elem(params.raw(), pt, b), pt, k);
        }
      }
    });
  }
}

double CpuBackend::sum_of_squares(const Tensor& g, ExecContext&) {
  const std::int64_t n = g.numel();
  const DType dt = g.dtype();
  // Fixed-size chunks summed in order: the result depends on neither the thread count nor timing.
  constexpr std::int64_t kSumChunk = 1 << 16;
  const std::int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> part(static_cast<std::size_t>(chunks), 0.0);
  parallel_for(chunks, 2, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t b = c * kSumChunk, e = std::min(n, b + kSumChunk);
      const float* gp = load_row(elem(g.raw(), dt, b), dt, e - b, 0);
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t i = 0;
      for (; i + 8 <= e - b; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += gp[i + k] * gp[i + k];
      double s = 0;
      for (int k = 0; k < 8; ++k) s += acc[k];
      for (; i < e - b; ++i) s += static_cast<double>(gp[i]) * gp[i];
      part[static_cast<std::size_t>(c)] = s;
    }
  });
  double total = 0;
  for (double s : part) total += s;
  return total;
}

bool CpuBackend::has_non_finite(const Tensor& g, ExecContext& ctx) { return !std::isfinite(sum_of_squares(g, ctx)); }

void CpuBackend::scale_(Tensor& g, float factor, ExecContext&) {
  const DType dt = g.dtype();
  if (dt == DType::kF32) {
    float* gp = g.f32();
    parallel_for(g.numel(), 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) gp[i] *= factor;
    });
    return;
  }
  const std::int64_t n = g.numel(), chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, 2, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t b = c * kChunk, k = std::min(n, b + kChunk) - b;
      float* p = inout_row(elem(g.raw(), dt, b), dt, k, 0);
      for (std::int64_t i = 0; i < k; ++i) p[i] *= factor;
      store_row(p, elem(g.raw(), dt, b), dt, k);
    }
  });
}

}  // namespace cpu
}  // namespace scalelab::kernels
