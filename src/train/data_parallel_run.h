#pragma once
// The trainer's data-parallel side, for a run with more than one rank (`mpirun -np N scalelab
// train ...`, `srun --mpi=pmix scalelab train ...`). run_training() calls it at a few points of
// its step loop; a one-rank run never builds one, so its arithmetic is the single-process
// trainer's, bit for bit.
//
//   DataParallelRun dp(dist, options.dist, precision, P);     // checks, computes the shard
//   m, v: dp.state_numel() elements (ZeRO-1: this rank's shard; else all P)
//   dp.attach(params, grads, m, v, zero_recv, model);           // reducer + the model's hook
//   per step:  dp.begin_micro_step(last) before each micro-step's forward/backward
//              sum_sq = dp.sync_gradients();   loss = dp.mean(loss);
//              dp.update(ranges, hyper, ctx);  dp.end_step(measured);
//   at the end: dp.finish(result, ...)         // collective: global figures into the record
//
// DDP (--zero 0): gradient buckets are all-reduced (averaged) while backward goes on, launched by
// the model's grad-ready hook; with gradient accumulation only the last micro-step communicates.
// ZeRO-1 (--zero 1): after backward the gradients are reduce-scattered, each rank updates its
// shard (and holds optimizer states for it only), then the parameters are all-gathered.
// Gradients and master weights must be fp32 (fp32 or --mixed-precision runs): the communicator
// reduces fp32; --model-precision bf16 is refused with a way out.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "core/tensor.h"
#include "distributed/data_parallel.h"
#include "distributed/dist_context.h"
#include "distributed/dist_flags.h"
#include "kernels/adamw.h"
#include "model/model.h"
#include "train/data.h"
#include "train/precision.h"

namespace scalelab {

struct TrainResult;

// Threads of one rank for --threads 0 ("all cores"): the cores this process may run on when the
// launcher bound it to fewer than the machine has, else the machine's cores divided by the ranks
// on this node (at least 1). Any other request is returned as it is.
int threads_for_rank(int requested, const LaunchEnv& env);

// Wraps a rank's data source for failure tests: SCALELAB_INJECT_DATA_FAULT=RANK:MICRO_STEP makes
// rank RANK's data source throw InvalidInput ("cannot read ...") on its MICRO_STEP-th micro-batch
// (0-based), as an unreadable file on that rank only would. Unset: the source is returned as is.
std::unique_ptr<DataSource> with_injected_data_fault(std::unique_ptr<DataSource> source, int rank);

// Communication time of measured steps, this rank.
struct CommTimes {
  double comm_s = 0;     // time collectives ran
  double hidden_s = 0;   // ... of which overlapped with backward
  double exposed_s = 0;  // ... of which the step waited for
  double blocked_s = 0;  // wall time the trainer was blocked in synchronization
};

class DataParallelRun {
 public:
  // Throws InvalidInput when the precision cannot be data-parallel or a flag is bad.
  DataParallelRun(DistContext& dist, const DistFlags& flags, const PrecisionPlan& precision, std::int64_t numel);
  ~DataParallelRun();
  DataParallelRun(const DataParallelRun&) = delete;
  DataParallelRun& operator=(const DataParallelRun&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool zero() const { return zero_; }
  // The elements whose optimizer states this rank holds: [state_begin, state_begin + state_numel).
  std::int64_t state_begin() const { return state_begin_; }
  std::int64_t state_numel() const { return state_numel_; }

  // Builds the reducer over the flat buffers (which must outlive this object) and installs the
  // model's grad-ready hook. m and v have state_numel() elements; zero_recv (ZeRO-1 only) is the
  // fp32 reduce-scatter output of state_numel() elements, taken from the allocator.
  void attach(Tensor& params, Tensor& grads, Tensor& m, Tensor& v, Tensor* zero_recv, Model& model);

  void begin_micro_step(bool last);
  // The communication on the run's timeline (DataParallel::set_tracer); null: none.
  void set_tracer(Tracer* tracer);
  // After the last micro-step's backward: the gradients become their average over the ranks;
  // returns their sum of squares (inf/NaN when any is), the same on every rank.
  double sync_gradients();
  // The mean over ranks of a per-rank value (collective).
  double mean(double value);
  // AdamW (hyper-parameters and ranges as the single-process update) over this rank's elements;
  // ZeRO-1 then all-gathers the parameters.
  void update(const std::vector<kernels::ElementRange>& ranges, const kernels::AdamWHyper& hyper, ExecContext& ctx);
  // After each step: adds its communication to the measured figures when `measured`.
  void end_step(bool measured);

  // Collective, on every rank at the end of a run that succeeded: gathers the ranks' figures and
  // fills the result with the global ones (tokens_per_s over all ranks against the slowest
  // rank's measured time, tokens_per_s_per_device, the largest memory peak, the per-rank table,
  // communication time and how much of it was hidden, energy summed over the ranks that sampled).
  // tokens_per_step: this rank's tokens per optimizer step.
  void finish(TrainResult& result, std::int64_t tokens_per_step, double measured_time_s, double step_time_s);

 private:
  CommTimes cumulative() const;

  DistContext& dist_;
  DistFlags flags_;
  int rank_ = 0, world_ = 1;
  bool zero_ = false;
  std::int64_t numel_ = 0, state_begin_ = 0, state_numel_ = 0;
  std::unique_ptr<DataParallel> dp_;
  // Bound by attach(); the update of the current step (set by update() for the callback).
  Tensor *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  const std::vector<kernels::ElementRange>* ranges_ = nullptr;
  const kernels::AdamWHyper* hyper_ = nullptr;
  ExecContext* ctx_ = nullptr;
  CommTimes measured_, last_cumulative_;
  std::int64_t measured_steps_ = 0;
};

}  // namespace scalelab
