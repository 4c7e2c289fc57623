#pragma once
// The device buffers a training run holds for its whole life, allocated in one place and one
// order: the trainer allocates them on the run's device, the memory plan on the meta device, so
// the plan measures exactly what the run will hold.
#include <cstdint>

#include "core/allocator.h"
#include "core/tensor.h"
#include "train/precision.h"

namespace scalelab {

// The parameter layout puts the trainable parameters first (model/params.h): the trainable
// buffer is the prefix [0, Pt) of the parameter buffer, and gradients and AdamW states exist for
// it only. A frozen parameter costs its weights (the master copy, and the compute copy under
// mixed precision: kept whole, so that --save writes frozen weights exactly as loaded) and
// nothing else; the plan shrinks by exactly the frozen gradients and optimizer states.
struct StepBuffers {
  Tensor params;             // master parameters [P] (param dtype): trainable [0, Pt), frozen after
  Tensor compute_weights;    // the weights the model multiplies with: params itself, or a copy [P]
  Tensor trainable;          // params[0, Pt): what AdamW updates (a view)
  Tensor compute_trainable;  // compute_weights[0, Pt): refreshed from `trainable` after each update
  Tensor grads;              // [Pt] (or the compact layout's grad_numel), zeroed
  Tensor m, v;               // AdamW states of this rank's shard [S] of the trainable buffer, zeroed
  Tensor zero_recv;          // ZeRO-1: the shard's reduce-scatter output (fp32), else undefined
};

// total_params P, trainable_params Pt (<= P), state_numel S (Pt, or this rank's ZeRO-1 shard of
// it), zero_shard: ZeRO-1 with more than one rank. Throws OutOfMemory as any allocation does. The
// micro-batch's ids come next (make_batch / make_staged_batch), after the weights are loaded and
// the model is built.
// grad_numel: the gradient buffer's elements when it is not laid out like the trainable buffer
// (ParamLayout::grad_numel with --optimizer-in-backward); < 0: trainable_params.
StepBuffers allocate_step_buffers(DeviceAllocator& alloc, const PrecisionPlan& prec, std::int64_t total_params,
                                  std::int64_t trainable_params, std::int64_t state_numel, bool zero_shard,
                                  std::int64_t grad_numel = -1);

}  // namespace scalelab
