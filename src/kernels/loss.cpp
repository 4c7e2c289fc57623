// Front of the loss family (loss.h): validation, profiling, dispatch. Target values are checked
// by the backend, which is where they can be read.
#include "kernels/loss.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

LossSum cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets, ExecContext& ctx) {
  ProfileScope prof(ctx, "loss", Phase::kForward);
  const char* op = "cross_entropy_forward";
  require_dtype(targets, DType::kI32, op, "targets");
  require_dtype(lse, DType::kF32, op, "lse");
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  require_numel(targets, rows, op, "targets");
  require_numel(lse, rows, op, "lse");
  return backend_for(device_of(op, {&lse, &logits, &targets}), op).cross_entropy_forward(lse, logits, targets, ctx);
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            float grad_scale, ExecContext& ctx) {
  ProfileScope prof(ctx, "loss", Phase::kBackward);
  const char* op = "cross_entropy_backward";
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  require_numel(dlogits, rows * V, op, "logits gradient");
  backend_for(device_of(op, {&dlogits, &logits, &lse, &targets}), op)
      .cross_entropy_backward(dlogits, logits, lse, targets, grad_scale, ctx);
}

}  // namespace scalelab::kernels
