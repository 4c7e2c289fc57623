#include "train/step_buffers.h"

namespace scalelab {

StepBuffers allocate_step_buffers(DeviceAllocator& alloc, const PrecisionPlan& prec, std::int64_t total_params,
                                  std::int64_t trainable_params, std::int64_t state_numel, bool zero_shard,
                                  std::int64_t grad_numel) {
  StepBuffers b;
  const std::int64_t P = total_params, Pt = trainable_params, S = state_numel;
  b.params = Tensor::empty({P}, prec.param, alloc, "weights");
  b.compute_weights =
      prec.weight_copy ? Tensor::empty({P}, prec.compute_weights, alloc, "weights (compute copy)") : b.params;
  b.trainable = Pt == P ? b.params : b.params.slice(0, Pt);
  b.compute_trainable = Pt == P ? b.compute_weights : b.compute_weights.slice(0, Pt);
  b.grads = Tensor::zeros({grad_numel < 0 ? Pt : grad_numel}, prec.grad, alloc, "gradients");
  b.m = Tensor::zeros({S}, prec.optim_state, alloc, "optimizer exp_avg");
  b.v = Tensor::zeros({S}, prec.optim_state, alloc, "optimizer exp_avg_sq");
  if (zero_shard && S > 0) b.zero_recv = Tensor::empty({S}, DType::kF32, alloc, "gradient shard (ZeRO-1)");
  return b;
}

}  // namespace scalelab
