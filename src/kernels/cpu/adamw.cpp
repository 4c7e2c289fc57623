#include "kernels/adamw.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads, const std::vector<ElementRange>& ranges,
                  const AdamWHyper& hp, ExecContext& ctx) {
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  require_cpu(params, "adamw_update");
  const std::int64_t n = params.numel();
  require_numel(m, n, "adamw_update", "exp_avg");
  require_numel(v, n, "adamw_update", "exp_avg_sq");
  require_numel(grads, n, "adamw_update", "grads");
  float* p = params.f32();
  float* mp = m.f32();
  float* vp = v.f32();
  const float* g = grads.f32();
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = hp.beta1, b2 = hp.beta2, omb1 = 1.0f - hp.beta1, omb2 = 1.0f - hp.beta2, eps = hp.eps;
  for (const auto& r : ranges) {
    SCALELAB_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= n, "[adamw_update] range outside the buffer");
    const float decay = r.decay ? 1.0f - hp.lr * hp.weight_decay : 1.0f;
    parallel_for(r.end - r.begin, 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = r.begin + i0; i < r.begin + i1; ++i) {
        const float gi = g[i];
        const float mi = b1 * mp[i] + omb1 * gi;
        const float vi = b2 * vp[i] + omb2 * gi * gi;
        mp[i] = mi;
        vp[i] = vi;
        const float denom = std::sqrt(vi) / bc2_sqrt + eps;
        p[i] = p[i] * decay - step_size * (mi / denom);
      }
    });
  }
}

double sum_of_squares(const Tensor& g, ExecContext& ctx) {
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  require_cpu(g, "sum_of_squares");
  const float* gp = g.f32();
  const std::int64_t n = g.numel();
  // Fixed-size chunks summed in order: the result depends on neither the thread count nor timing.
  constexpr std::int64_t kChunk = 1 << 16;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<std::size_t>(chunks), 0.0);
  parallel_for(chunks, 2, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t b = c * kChunk, e = std::min(n, b + kChunk);
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t i = b;
      for (; i + 8 <= e; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += gp[i + k] * gp[i + k];
      double s = 0;
      for (int k = 0; k < 8; ++k) s += acc[k];
      for (; i < e; ++i) s += static_cast<double>(gp[i]) * gp[i];
      part[static_cast<std::size_t>(c)] = s;
    }
  });
  double total = 0;
  for (double s : part) total += s;
  return total;
}

void scale_(Tensor& g, float factor, ExecContext& ctx) {
  require_cpu(g, "scale_");
  float* gp = g.f32();
  parallel_for(g.numel(), 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) gp[i] *= factor;
  });
}

void clip_with_norm_(Tensor& g, double total_norm, double max_norm, ExecContext& ctx) {
  if (max_norm <= 0) return;
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef < 1.0) scale_(g, static_cast<float>(coef), ctx);
}

double clip_grad_norm_(Tensor& g, double max_norm, ExecContext& ctx) {
  const double total = std::sqrt(sum_of_squares(g, ctx));
  clip_with_norm_(g, total, max_norm, ctx);
  return total;
}

}  // namespace scalelab::kernels
