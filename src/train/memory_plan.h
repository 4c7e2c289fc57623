#pragma once
// The memory plan: from the configuration alone, the bytes each part of a training step needs on
// the device (weights, gradients, optimizer states, activations per layer, attention scores,
// logits, backward temporaries, workspace, allocator rounding), the total against the capacity,
// and the largest micro-batch that fits. It models the engine's allocation timeline analytically
// (the caching allocator keeps freed blocks reserved, so the head's logits stay reserved while
// the first layer's backward temporaries are allocated); tests hold measured peaks to it.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
};

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
  nlohmann::json to_json() const;
  std::string to_table() const;  // a human-readable breakdown
};

// The plan for in.micro_batch, with max_micro_batch searched against in.capacity.
MemoryPlan plan_memory(const PlanInput& in);
// Only the predicted total for a micro-batch (no search).
std::size_t plan_total_bytes(const PlanInput& in);

}  // namespace scalelab
