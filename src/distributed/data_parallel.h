#pragma once
// Data parallelism for the trainer, in one object: DDP (gradients all-reduced in buckets,
// overlapped with backward) or ZeRO-1 (gradients reduce-scattered, optimizer states sharded,
// parameters all-gathered). Host memory (CPU training); a CUDA trainer uses GradReducer over a
// NCCL communicator directly.
//
// The trainer's step, with G micro-steps of gradient accumulation:
//
//   for (int m = 0; m < G; ++m) {
//     dp.begin_micro_step(/*last=*/m == G - 1);
//     forward; backward, calling dp.mark_ready(begin, end) as each layer's gradient range is final
//   }
//   const double grad_norm = dp.end_backward();   // synchronized gradient's global L2 norm
//   clip = min(1, max_grad_norm / (grad_norm + 1e-6));
//   dp.optimizer_step();   // calls update(begin, end) on this rank's range, gathers params
//
// update(begin, end) applies AdamW (with the clip factor) to elements [begin, end) of the flat
// buffers; optimizer states are needed only for [optimizer_begin(), optimizer_end()).
#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "distributed/communicator.h"
#include "distributed/ddp.h"
#include "distributed/zero.h"

namespace scalelab {

struct DataParallelOptions {
  DdpOptions ddp;      // --ddp-bucket-mb
  int zero_stage = 0;  // --zero 0|1
  // true: the collectives average (sum, then a division pass over the buffer). false: they only
  // sum, because the caller already divided each rank's gradient by the world size (the trainer
  // folds 1/world into the loss gradient's seed, as it folds 1/accumulation steps): on the CPU
  // the division is one more pass over every gradient byte on the cores that compute.
  bool average = true;
};

class DataParallel {
 public:
  using UpdateRange = ZeroOptimizer::UpdateRange;

  // Throws InvalidInput for a zero stage other than 0 or 1. zero_recv: ZeRO-1's reduce-scatter
  // output (ZeroOptimizer::shard_counts()[rank] floats), or null for a buffer of its own.
  DataParallel(Communicator& comm, float* params, float* grads, std::int64_t numel, DataParallelOptions options,
               UpdateRange update, float* zero_recv = nullptr);

  std::int64_t optimizer_begin() const;
  std::int64_t optimizer_end() const;

  void begin_micro_step(bool last);
  void mark_ready(std::int64_t begin, std::int64_t end);
  // After the last micro-step's backward: synchronizes the gradients and returns their global L2
  // norm. Throws RuntimeError when called after a micro-step that was not the last.
  double end_backward();
  void optimizer_step();

  // For the run record: world size, mode, bucket size and the communication times (this rank).
  nlohmann::json summary() const;
  const DdpStats& ddp_stats() const;
  // DDP: the bucket launches, waits and all-reduces on a timeline (GradReducer::set_tracer).
  // ZeRO-1: its reduce-scatter and all-gather on the communication track (cat "comm", args.bytes),
  // and "zero wait" on the calling thread over each (they block the step: all exposed).
  void set_tracer(Tracer* tracer);

 private:
  Communicator& comm_;
  float* params_;
  float* grads_;
  std::int64_t numel_;
  DataParallelOptions options_;
  UpdateRange update_;
  std::unique_ptr<GradReducer> reducer_;  // zero_stage 0
  std::unique_ptr<ZeroOptimizer> zero_;   // zero_stage 1
  bool last_micro_ = false;
  bool synced_ = false;
  Tracer* tracer_ = nullptr;
};

// A per-rank figure summarized over the ranks (collective): min, max, mean, sum.
struct RankSummary {
  double min = 0, max = 0, mean = 0, sum = 0;
};
RankSummary summarize_over_ranks(Communicator& comm, double value);

}  // namespace scalelab
