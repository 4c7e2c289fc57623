#pragma once
// ZeRO stage 1: optimizer states sharded over the ranks.
//
// Each rank owns one contiguous shard [shard_begin, shard_end) of the flat parameter buffer
// (even_counts(): equal sizes rounded to 16 elements, the last shards shorter). A step:
//   1. reduce_gradients(): reduce-scatter of the flat gradient buffer (average over ranks); this
//      rank's shard of the gradient buffer then holds the averaged gradient (the rest of the
//      buffer is left as it was: stale). Returns the global L2 norm of the averaged gradient (the
//      shards' sums of squares all-reduced), for --max-grad-norm clipping.
//   2. update_and_gather(): calls the trainer's update(shard_begin, shard_end), which applies
//      AdamW to those elements of the flat buffers, then all-gathers the parameters so that
//      every rank holds all of them.
// The trainer allocates optimizer states (AdamW m, v; fp32 master weights) for the shard only
// and indexes them with i - shard_begin(): that is the memory ZeRO-1 saves, (W-1)/W of it.
// All buffers are fp32 and must outlive the optimizer.
#include <cstdint>
#include <functional>
#include <vector>

#include "distributed/communicator.h"

namespace scalelab {

struct ZeroStats {
  std::int64_t steps = 0;
  double reduce_scatter_s = 0;  // wall time in the gradient reduce-scatter (+ norm all-reduce)
  double all_gather_s = 0;      // wall time in the parameter all-gather
  double update_s = 0;          // wall time in update(shard)
};

// Sum of x[i]^2 in double, over OpenMP threads with a fixed split: the same result every run at
// a given thread count (the gradient norm for clipping).
double sum_of_squares(const float* x, std::int64_t n);

class ZeroOptimizer {
 public:
  // Applies the optimizer to elements [begin, end) of the flat parameter/gradient buffers.
  using UpdateRange = std::function<void(std::int64_t begin, std::int64_t end)>;

  // recv: where the reduce-scatter lands (shard_numel() floats, not overlapping grads), e.g. a
  // buffer the trainer took from its device allocator so that the memory plan counts it; null:
  // the optimizer keeps its own host vector.
  // average: the reduce-scatter averages over ranks; false: it sums (the gradients were already
  // divided by the world size).
  ZeroOptimizer(Communicator& comm, float* params, float* grads, std::int64_t numel, UpdateRange update,
                float* recv = nullptr, bool average = true);

  // The shard sizes for numel elements over world_size ranks (what the constructor uses): the
  // trainer sizes its optimizer states (and the memory plan) with them before building one.
  static std::vector<std::int64_t> shard_counts(std::int64_t numel, int world_size);

  std::int64_t shard_begin() const { return shard_begin_; }
  std::int64_t shard_end() const { return shard_end_; }
  std::int64_t shard_numel() const { return shard_end_ - shard_begin_; }
  const std::vector<std::int64_t>& shard_counts() const { return counts_; }

  // Step 1 (after backward of the last micro-step); returns the global gradient L2 norm.
  double reduce_gradients();
  // Step 2: update this rank's shard, then all-gather the parameters.
  void update_and_gather();
  // Both; returns the global gradient norm.
  double step() {
    const double norm = reduce_gradients();
    update_and_gather();
    return norm;
  }

  const ZeroStats& stats() const { return stats_; }

 private:
  Communicator& comm_;
  float* params_;
  float* grads_;
  std::int64_t numel_;
  UpdateRange update_;
  std::vector<std::int64_t> counts_;
  std::int64_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<float> own_recv_;  // reduce-scatter output when the caller gave no buffer
  float* recv_ = nullptr;
  bool reduced_ = false;
  bool average_ = true;
  ZeroStats stats_;
};

}  // namespace scalelab
