// Front of the loss family (loss.h): validation, profiling, dispatch. Target values are checked
// by the backend, which is where they can be read.
#include "kernels/loss.h"

#include "kernels/backend.h"
#include "kernels/kernel_common.h"
#include "kernels/logprobs.h"
#include "kernels/logprobs_impl.h"

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

void token_logprobs_forward(Tensor& logp, const Tensor& logits, const Tensor& lse, const Tensor& targets, ExecContext& ctx) {
  ProfileScope prof(ctx, "loss", Phase::kForward);
  const char* op = "token_logprobs_forward";
  require_dtype(targets, DType::kI32, op, "targets");
  require_dtype(lse, DType::kF32, op, "lse");
  require_dtype(logp, DType::kF32, op, "logp");
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  require_numel(targets, rows, op, "targets");
  require_numel(lse, rows, op, "lse");
  require_numel(logp, rows, op, "logp");
  const DeviceType dev = device_of(op, {&logp, &logits, &lse, &targets});
  backend_for(dev, op);  // refuses a device this build or machine does not have
  if (dev == DeviceType::kCPU) cpu::token_logprobs_forward(logp, logits, lse, targets, ctx);
  if (dev == DeviceType::kCUDA) cuda::token_logprobs_forward(logp, logits, lse, targets, ctx);
  // meta: nothing to compute, nothing to allocate
}

void token_logprobs_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                     const Tensor& dlogp, ExecContext& ctx) {
  ProfileScope prof(ctx, "loss", Phase::kBackward);
  const char* op = "token_logprobs_backward";
  require_dtype(targets, DType::kI32, op, "targets");
  require_dtype(lse, DType::kF32, op, "lse");
  require_dtype(dlogp, DType::kF32, op, "dlogp");
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  require_numel(dlogits, rows * V, op, "logits gradient");
  require_numel(targets, rows, op, "targets");
  require_numel(lse, rows, op, "lse");
  require_numel(dlogp, rows, op, "dlogp");
  const DeviceType dev = device_of(op, {&dlogits, &logits, &lse, &targets, &dlogp});
  backend_for(dev, op);
  if (dev == DeviceType::kCPU) cpu::token_logprobs_backward(dlogits, logits, lse, targets, dlogp, ctx);
  if (dev == DeviceType::kCUDA) cuda::token_logprobs_backward(dlogits, logits, lse, targets, dlogp, ctx);
}

}  // namespace scalelab::kernels
