#pragma once
// Peak GPU memory of a Hugging Face Trainer job, predicted without running it: the job's
// allocation schedule (predict/hf_schedule.h) replayed through the CUDA caching allocator replica
// (predict/caching_allocator.h) with the device's memory less the CUDA context as its limit.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "predict/caching_allocator.h"
#include "predict/hf_schedule.h"

namespace scalelab::predict {

// Memory outside the caching allocator, measured: torch 2.11+cu130 on an H200 (driver 580):
// nvidia-smi's per-process usage minus torch.cuda.memory_reserved() right after the context is
// created (bench/gpu/results/2026-11-26-h200-hf-memory/hf_memory.json, "cuda_context_bytes").
inline constexpr std::size_t kDefaultCudaContext = 543162368;  // 518 MiB

struct HfPredictOptions {
  std::size_t device_memory = 0;    // the GPU's total (torch.cuda.get_device_properties().total_memory)
  std::size_t cuda_context = kDefaultCudaContext;
  // NCCL's communicator buffers (DDP, --ranks > 1): cudaMalloc'd by NCCL itself, outside the
  // caching allocator; subtracted like the context. Not measured here: 0 unless given.
  std::size_t nccl_memory = 0;
  AllocatorConfig allocator;
};

struct StepPeak {
  std::size_t max_allocated = 0, max_reserved = 0;  // cumulative up to this step's end
  std::size_t segments = 0, small_segments = 0;     // live at this step's end (as hf_memory.py records)
};

struct HfPrediction {
  bool oom = false;
  std::string oom_at;           // phase and label of the request that failed
  std::size_t oom_request = 0;
  std::size_t max_allocated = 0;
  std::size_t max_reserved = 0;
  std::size_t allocator_limit = 0;   // device_memory - cuda_context
  std::string peak_phase;            // where max_allocated was reached
  std::int64_t peak_step = 0;
  // Live bytes per category at the max_allocated moment (block sizes after rounding).
  std::size_t breakdown[kNumCategories] = {};
  std::size_t reserved_at_peak = 0;  // reserved at that moment
  std::vector<StepPeak> steps;
  AllocatorStats stats;
  std::size_t events = 0;
};

HfPrediction predict_hf(const HfJob& job, const HfPredictOptions& o);

// The largest micro-batch whose prediction fits (no OOM) in o.device_memory; 0 when 1 does not.
// `limit` caps the search. Assumes the peak grows with the micro-batch (it does: every
// activation, logits and loss tensor scales with it).
inline constexpr std::int64_t kMicroBatchSearchCap = std::int64_t{1} << 16;
std::int64_t largest_micro_batch(HfJob job, const HfPredictOptions& o, std::int64_t limit = kMicroBatchSearchCap);

// The schedule as text, one line per event: `a BYTES CATEGORY LABEL` (allocations numbered from
// 0), `f N` (the free of allocation N), `# PHASE` (tools/predict/trace_to_events.py writes the
// recorded GPU runs in the same form).
std::string schedule_text(const std::vector<ScheduleEvent>& ev);

// The record `plan --stack hf-trainer --json` writes.
nlohmann::json prediction_json(const HfJob& job, const HfPredictOptions& o, const HfPrediction& p,
                               std::int64_t largest);
// The human-readable table.
std::string prediction_table(const HfJob& job, const HfPredictOptions& o, const HfPrediction& p,
                             std::int64_t largest);

}  // namespace scalelab::predict
