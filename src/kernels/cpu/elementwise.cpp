#include "kernels/elementwise.h"

#include "core/parallel.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void add_(Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase) {
  ProfileScope prof(ctx, "elementwise", phase);
  require_cpu(a, "add_");
  require_numel(b, a.numel(), "add_", "b");
  float* ap = a.f32();
  const float* bp = b.f32();
  parallel_for(a.numel(), 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) ap[i] += bp[i];
  });
}

void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase) {
  ProfileScope prof(ctx, "elementwise", phase);
  require_cpu(a, "add");
  require_numel(b, a.numel(), "add", "b");
  require_numel(out, a.numel(), "add", "out");
  float* op = out.f32();
  const float* ap = a.f32();
  const float* bp = b.f32();
  parallel_for(a.numel(), 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) op[i] = ap[i] + bp[i];
  });
}

}  // namespace scalelab::kernels
