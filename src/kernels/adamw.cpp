// Front of the adamw family (adamw.h): validation, profiling, dispatch; gradient clipping built on
// the ops.
#include "kernels/adamw.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads, const std::vector<ElementRange>& ranges,
                  const AdamWHyper& hp, ExecContext& ctx) {
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  const char* op = "adamw_update";
  const std::int64_t n = params.numel();
  require_numel(m, n, op, "exp_avg");
  require_numel(v, n, op, "exp_avg_sq");
  require_numel(grads, n, op, "grads");
  for (const auto& r : ranges) {
    SCALELAB_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= n, "[adamw_update] range outside the buffer");
  }
  backend_for(device_of(op, {&params, &m, &v, &grads}), op).adamw_update(params, m, v, grads, ranges, hp, ctx);
}

std::vector<ElementRange> ranges_within(const std::vector<ElementRange>& ranges, std::int64_t begin, std::int64_t end) {
  std::vector<ElementRange> local;
  for (const auto& r : ranges) {
    const std::int64_t lo = std::max(r.begin, begin), hi = std::min(r.end, end);
    if (hi > lo) local.push_back({lo - begin, hi - begin, r.decay});
  }
  return local;
}

double sum_of_squares(const Tensor& g, ExecContext& ctx) {
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  const char* op = "sum_of_squares";
  return backend_for(device_of(op, {&g}), op).sum_of_squares(g, ctx);
}

bool has_non_finite(const Tensor& g, ExecContext& ctx) {
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  const char* op = "has_non_finite";
  return backend_for(device_of(op, {&g}), op).has_non_finite(g, ctx);
}

void scale_(Tensor& g, float factor, ExecContext& ctx) {
  const char* op = "scale_";
  backend_for(device_of(op, {&g}), op).scale_(g, factor, ctx);
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

void clip_with_norm_(Tensor& g, double total_norm, double max_norm, ExecContext& ctx) {
  ProfileScope prof(ctx, "adamw", Phase::kOptimizer);
  const double coef = clip_coefficient(total_norm, max_norm);
  if (coef < 1.0) scale_(g, static_cast<float>(coef), ctx);
}

double clip_grad_norm_(Tensor& g, double max_norm, ExecContext& ctx) {
  const double total = std::sqrt(sum_of_squares(g, ctx));
  clip_with_norm_(g, total, max_norm, ctx);
  return total;
}

}  // namespace scalelab::kernels
