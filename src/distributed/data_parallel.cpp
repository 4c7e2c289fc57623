#include "distributed/data_parallel.h"

#include <cmath>

#include "core/error.h"
#include "core/trace.h"

namespace scalelab {

DataParallel::DataParallel(Communicator& comm, float* params, float* grads, std::int64_t numel,
                           DataParallelOptions options, UpdateRange update, float* zero_recv)
    : comm_(comm), params_(params), grads_(grads), numel_(numel), options_(options), update_(std::move(update)) {
  SCALELAB_CHECK_INPUT(options.zero_stage == 0 || options.zero_stage == 1,
                       "[dist] --zero " + std::to_string(options.zero_stage) +
                           " is not supported — use 0 (DDP) or 1 (sharded optimizer states)");
  SCALELAB_CHECK(!comm.device_memory(), "[dist] DataParallel works on host memory; with NCCL use GradReducer");
  if (options.zero_stage == 1) {
    zero_ = std::make_unique<ZeroOptimizer>(comm, params, grads, numel, update_, zero_recv, options.average);
  } else {
    DdpOptions ddp = options.ddp;
    ddp.average = options.average;
    reducer_ = std::make_unique<GradReducer>(comm, grads, numel, ddp);
  }
}

std::int64_t DataParallel::optimizer_begin() const { return zero_ ? zero_->shard_begin() : 0; }
std::int64_t DataParallel::optimizer_end() const { return zero_ ? zero_->shard_end() : numel_; }

void DataParallel::begin_micro_step(bool last) {
  last_micro_ = last;
  synced_ = false;
  if (reducer_) reducer_->begin_step(last);
}

void DataParallel::mark_ready(std::int64_t begin, std::int64_t end) {
  // ZeRO-1 reduce-scatters after backward (not overlapped yet): nothing to do early.
  if (reducer_) reducer_->mark_ready(begin, end);
}

void DataParallel::set_tracer(Tracer* tracer) {
  tracer_ = tracer;
  if (reducer_) reducer_->set_tracer(tracer);
}

namespace {

// Runs a blocking ZeRO collective, and with a tracer records it on the communication track and
// the wait for it on the calling thread.
template <class F>
auto traced_collective(Tracer* tracer, const char* name, std::int64_t bytes, F&& f) {
  if (!tracer) return f();
  const auto t0 = Tracer::Clock::now();
  auto result = f();
  const auto t1 = Tracer::Clock::now();
  tracer->complete(name, "comm", t0, t1, "comm", -1, bytes, Tracer::kCommTid);
  tracer->complete("zero wait", "comm", t0, t1, "comm");
  return result;
}

}  // namespace

double DataParallel::end_backward() {
  SCALELAB_CHECK(last_micro_, "[dist] end_backward after a micro-step that was not the last of the step — "
                              "call begin_micro_step(true) on the last micro-step");
  synced_ = true;
  if (zero_) {
    return traced_collective(tracer_, "reduce_scatter", numel_ * static_cast<std::int64_t>(sizeof(float)),
                             [&] { return zero_->reduce_gradients(); });
  }
  reducer_->finish();
  return std::sqrt(sum_of_squares(grads_, numel_));
}

void DataParallel::optimizer_step() {
  SCALELAB_CHECK(synced_, "[dist] optimizer_step before end_backward — synchronize the gradients first");
  synced_ = false;
  if (zero_) {
    // The shard's update runs inside (before the gather): the event spans both, named for the
    // collective that dominates at scale.
    traced_collective(tracer_, "update + all_gather", numel_ * static_cast<std::int64_t>(sizeof(float)), [&] {
      zero_->update_and_gather();
      return 0;
    });
  } else if (numel_ > 0) {
    update_(0, numel_);
  }
}

const DdpStats& DataParallel::ddp_stats() const {
  static const DdpStats kNone{};
  return reducer_ ? reducer_->total() : kNone;
}

nlohmann::json DataParallel::summary() const {
  nlohmann::json j;
  j["backend"] = comm_.backend();
  j["world_size"] = comm_.world_size();
  j["rank"] = comm_.rank();
  j["zero"] = options_.zero_stage;
  if (reducer_) {
    const DdpStats& s = reducer_->total();
    j["ddp_bucket_mb"] = options_.ddp.bucket_mb;
    j["buckets_per_step"] = reducer_->buckets().size();
    j["comm_s"] = s.comm_s;
    j["comm_hidden_s"] = s.hidden_s;
    j["comm_exposed_s"] = s.exposed_s;
    j["comm_blocked_s"] = s.blocked_s;
    j["comm_hidden_fraction"] = s.hidden_fraction();
    j["buckets_launched_early"] = s.launched_early;
    j["buckets"] = s.buckets;
    j["comm_bytes"] = s.bytes;
    j["synced_steps"] = s.steps;
  } else {
    const ZeroStats& z = zero_->stats();
    j["shard_begin"] = zero_->shard_begin();
    j["shard_end"] = zero_->shard_end();
    j["reduce_scatter_s"] = z.reduce_scatter_s;
    j["all_gather_s"] = z.all_gather_s;
    j["update_s"] = z.update_s;
    j["comm_s"] = z.reduce_scatter_s + z.all_gather_s;
    j["comm_hidden_s"] = 0.0;  // ZeRO-1's collectives are not overlapped yet
    j["comm_hidden_fraction"] = 0.0;
    j["synced_steps"] = z.steps;
  }
  return j;
}

RankSummary summarize_over_ranks(Communicator& comm, double value) {
  RankSummary s;
  double v[2] = {value, -value};
  comm.all_reduce(v, 2, CommDType::kF64, ReduceOp::kMax);
  s.max = v[0];
  s.min = -v[1];
  s.sum = comm.all_reduce_value(value, ReduceOp::kSum);
  s.mean = s.sum / comm.world_size();
  return s;
}

}  // namespace scalelab
