// Front of the elementwise family (elementwise.h): validation, profiling, dispatch.
#include "kernels/elementwise.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void add_(Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase) {
  ProfileScope prof(ctx, "elementwise", phase);
  const char* op = "add_";
  require_numel(b, a.numel(), op, "b");
  backend_for(device_of(op, {&a, &b}), op).add_(a, b, ctx);
}

void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase) {
  ProfileScope prof(ctx, "elementwise", phase);
  const char* op = "add";
  require_numel(b, a.numel(), op, "b");
  require_numel(out, a.numel(), op, "out");
  backend_for(device_of(op, {&out, &a, &b}), op).add(out, a, b, ctx);
}

void bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx, Phase phase) {
  ProfileScope prof(ctx, "elementwise", phase);
  const char* op = "bias_add_";
  SCALELAB_CHECK(y.rank() >= 1 && y.dim(-1) == b.numel(),
                 std::string("[") + op + "] output " + y.shape().str() + " does not end in the bias size " +
                     std::to_string(b.numel()));
  backend_for(device_of(op, {&y, &b}), op).bias_add_(y, b, ctx);
}

}  // namespace scalelab::kernels
