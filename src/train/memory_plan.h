#pragma once
// The memory plan: from the configuration alone, the bytes each part of a training step needs on
// the device (weights, gradients, optimizer states, activations per layer, attention scores,
// logits, backward temporaries, workspace, allocator rounding), the total against the capacity,
// and the largest micro-batch that fits. It is measured, not modelled: the real model runs two
// training micro-steps on the meta device (core/device.h), whose kernels compute nothing and make
// only their workspace allocations, through the real caching allocator; the categories come from
// the allocations' labels and the model's AllocRegions. A new model, fused kernel or fine-tuning
// method is planned by the same code that runs it; tests hold measured peaks equal to the plan.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/model.h"
#include "train/precision.h"

namespace scalelab {

struct PlanInput {
  ModelConfig config;
  ModelOptions options;
  PrecisionPlan precision;
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 1;
  int threads = 1;
  std::size_t capacity = 0;
  // Data parallelism (distributed/data_parallel.h): the job's ranks and this rank. With zero_stage 1 and
  // more than one rank, the optimizer states cover only this rank's shard of the parameters, and
  // the shard's reduce-scatter output is one more buffer (ZeroOptimizer::shard_counts()).
  int world_size = 1;
  int rank = 0;
  int zero_stage = 0;
  // --freeze: the parameters matching it are frozen (ParamLayout::freeze); gradients and optimizer
  // states cover the trainable ones only, so the plan shrinks by exactly theirs.
  std::string freeze;
  // LoRA: adapters added to the layout, the base frozen (ParamLayout::add_lora).
  LoraConfig lora;
  // DPO (train/dpo.h): batches of 2·micro_batch rows ([chosen; rejected]), a reference forward
  // before each policy step, and without LoRA a frozen copy of the weights (the reference model).
  bool dpo = false;
  // QAT (--qat): the decoder layers' linear modules fake-quantize (ParamLayout::set_qat); what
  // they allocate (model/decoder/qat.h) is measured like any other allocation.
  QatConfig qat;
  // The device the plan is for (--device): the meta run mirrors its kernels' size choices where
  // they differ from the CPU's (the fused loss's chunk, kernels/fused.h).
  DeviceType device = DeviceType::kCPU;
  // --optimizer-in-backward: the gradient buffer is one decoder layer's shared slot plus the
  // parameters outside the layers (ParamLayout::share_layer_gradients).
  bool optimizer_in_backward = false;
};

// The run's parameter layout: the family's, with in.freeze applied (InvalidInput on a bad regex).
ParamLayout build_layout(const PlanInput& in);

// Parameters whose optimizer states this rank holds: all trainable ones, or its ZeRO-1 shard of
// them (trainable_params: the layout's trainable_numel()).
std::int64_t optimizer_state_numel(const PlanInput& in, std::int64_t trainable_params);

struct PlanItem {
  std::string name;
  std::size_t bytes = 0;    // the most this part holds at once during a step (what it needs)
  std::size_t at_peak = 0;  // what it holds at the moment of the peak (the items sum to total)
  std::string detail;
};

struct MemoryPlan {
  std::vector<PlanItem> items;
  std::size_t total = 0;      // predicted peak reserved bytes
  std::size_t capacity = 0;
  bool fits = false;
  std::int64_t max_micro_batch = 0;  // largest that fits the capacity (0: none)
  std::int64_t micro_batch = 0;
  int world_size = 1, rank = 0, zero_stage = 0;  // the plan is of this rank
  std::int64_t params = 0, trainable_params = 0, frozen_params = 0;  // the layout's (--freeze)
  nlohmann::json to_json() const;
  std::string to_table() const;  // a human-readable breakdown
};

// The plan for in.micro_batch, with max_micro_batch searched against in.capacity.
MemoryPlan plan_memory(const PlanInput& in);
// Only the predicted total for a micro-batch (no search).
std::size_t plan_total_bytes(const PlanInput& in);

}  // namespace scalelab
