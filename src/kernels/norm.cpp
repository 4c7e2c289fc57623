// Front of the norm family (norm.h): validation, profiling, dispatch to the tensors' backend.
#include "kernels/norm.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  const char* op = "rmsnorm_forward";
  require_dtype(rstd, DType::kF32, op, "rstd");
  const std::int64_t H = w.numel(), rows = x.numel() / H;
  require_numel(y, rows * H, op, "output");
  require_numel(rstd, rows, op, "rstd");
  backend_for(device_of(op, {&y, &rstd, &x, &w}), op).rmsnorm_forward(y, rstd, x, w, eps, ctx);
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w,
                      ExecContext& ctx, bool accumulate_dx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "rmsnorm_backward";
  const std::int64_t H = w.numel(), rows = x.numel() / H;
  require_numel(dx, rows * H, op, "input gradient");
  require_numel(dy, rows * H, op, "output gradient");
  if (dw.defined()) require_numel(dw, H, op, "weight gradient");  // undefined: frozen, skipped
  backend_for(device_of(op, {&dx, &dw, &dy, &x, &rstd, &w}), op)
      .rmsnorm_backward(dx, dw, dy, x, rstd, w, ctx, accumulate_dx);
}

}  // namespace scalelab::kernels
