#pragma once
// The device buffers a training run holds for its whole life, allocated in one place and one
// order: the trainer allocates them on the run's device, the memory plan on the meta device, so
// the plan measures exactly what the run will hold.
#include <cstdint>

#include "core/allocator.h"
#include "core/tensor.h"
#include "train/precision.h"

namespace scalelab {

struct StepBuffers {
  Tensor params;           // master parameters [P] (param dtype)
  Tensor compute_weights;  // the weights the model multiplies with: params itself, or a copy
  Tensor grads;            // [P], zeroed
  Tensor m, v;             // AdamW states of this rank's shard [S], zeroed
  Tensor zero_recv;        // ZeRO-1: the shard's reduce-scatter output (fp32), else undefined
};

// total_params P, state_numel S (P, or this rank's ZeRO-1 shard), zero_shard: ZeRO-1 with more
// than one rank. Throws OutOfMemory as any allocation does. The micro-batch's ids come next
// (make_batch / make_staged_batch), after the weights are loaded and the model is built.
StepBuffers allocate_step_buffers(DeviceAllocator& alloc, const PrecisionPlan& prec, std::int64_t total_params,
                                  std::int64_t state_numel, bool zero_shard);

}  // namespace scalelab
