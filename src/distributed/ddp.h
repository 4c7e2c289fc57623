#pragma once
// DDP gradient reduction over the flat gradient buffer, overlapped with backward.
//
// The gradient buffer has the parameter layout (model/params.h): embedding first, layers 0..L-1,
// final norm [and untied lm_head] last. Backward finishes them in the opposite order, so buckets
// are cut from the END of the buffer: bucket 0 is the last `first_bucket_mb` (small, as in
// PyTorch, so that communication starts early), then buckets of `bucket_mb` towards the start;
// the last bucket begins at element 0. Buckets are contiguous slices, so each is one in-place
// all-reduce.
//
// Use, per optimizer step (gradient accumulation communicates only on the last micro-step):
//
//   reducer.begin_step(/*sync=*/is_last_micro_step);
//   ... backward; as soon as a range of the gradient buffer is final (a layer's backward finished
//       on the last micro-step):  reducer.mark_ready(begin, end);
//   reducer.finish();   // waits for every bucket; grads now hold the average over ranks
//
// mark_ready() launches a bucket's all-reduce as soon as the bucket is fully marked (and every
// earlier bucket was launched: buckets go out in index order on every rank, so the collectives
// match). The communicator runs it while backward goes on (MPI: its communication thread; NCCL:
// its stream). finish() marks whatever was not marked (so a trainer that never calls mark_ready is
// correct, just not overlapped), waits, and records how much communication was hidden.
// Call mark_ready/finish from one thread; ranges marked in one step must not overlap.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace scalelab {

class Tracer;  // core/trace.h

struct GradBucket {
  int index = 0;
  std::int64_t begin = 0;  // elements of the flat buffer, [begin, end)
  std::int64_t end = 0;
  std::int64_t numel() const { return end - begin; }
};

// Buckets over a buffer of `numel` elements of `elem_bytes` each, in reverse order (bucket 0 at
// the end). Boundaries are multiples of `align` elements (cache lines) except the buffer's ends.
// Throws InvalidInput when a size is not positive (the --ddp-bucket-mb flag).
std::vector<GradBucket> plan_grad_buckets(std::int64_t numel, std::size_t elem_bytes, double first_bucket_mb,
                                          double bucket_mb, std::int64_t align = 16);

struct DdpOptions {
  double bucket_mb = 25.0;       // --ddp-bucket-mb (MiB)
  double first_bucket_mb = 1.0;  // the small first bucket
  bool average = true;           // average over ranks (DDP); false: sum
};

// Time spent communicating, per step and over all synchronized steps.
struct DdpStats {
  std::int64_t steps = 0;            // synchronized steps (micro-steps without sync not counted)
  std::int64_t buckets = 0;          // all-reduces issued
  std::int64_t launched_early = 0;   // ... of which before finish() was called (overlapped)
  std::int64_t bytes = 0;            // bytes all-reduced
  double comm_s = 0;     // time the collectives ran (the communication engine's busy time)
  double exposed_s = 0;  // ... of which after finish() was called (not hidden behind backward)
  double hidden_s = 0;   // comm_s - exposed_s: hidden behind backward
  double blocked_s = 0;  // wall time finish() waited
  double hidden_fraction() const { return comm_s > 0 ? hidden_s / comm_s : 0.0; }
  DdpStats& operator+=(const DdpStats& o);
};

// What happened during the current step, in order (for tests and debugging).
struct DdpEvent {
  enum class Kind { kMarkReady, kLaunch, kDone, kFinishBegin, kFinishEnd };
  Kind kind;
  int bucket = -1;            // kLaunch, kDone
  std::int64_t begin = 0;     // kMarkReady
  std::int64_t end = 0;
};
const char* ddp_event_name(DdpEvent::Kind k);

class GradReducer {
 public:
  // grads: the flat fp32 gradient buffer (device memory when comm.device_memory()); it must
  // outlive the reducer.
  GradReducer(Communicator& comm, float* grads, std::int64_t numel, DdpOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  const std::vector<GradBucket>& buckets() const { return buckets_; }

  // Starts a micro-step. sync=false: gradients accumulate locally and nothing is communicated
  // (mark_ready and finish do nothing); sync=true on the last micro-step of an optimizer step.
  void begin_step(bool sync);
  // Elements [begin, end) of the gradient buffer are final for this step. Throws RuntimeError if
  // the range is outside the buffer or overlaps a range already marked in this step.
  void mark_ready(std::int64_t begin, std::int64_t end);
  // Waits for every bucket (launching those not launched yet). Afterwards the gradient buffer is
  // the average (or sum) over ranks. Throws RuntimeError when a collective fails or times out.
  void finish();

  // Whether bucket i's all-reduce has completed (non-blocking; false if not launched).
  bool bucket_done(int i);

  const DdpStats& last_step() const { return last_; }
  const DdpStats& total() const { return total_; }
  std::vector<DdpEvent> events() const;

  // Puts the step's communication on a timeline (core/trace.h) from now on; null: none. Each
  // launch is a complete event "all_reduce launch" (category "comm", args.index the bucket,
  // args.bytes) on the launching thread, finish()'s wait is "ddp wait" there, and each bucket's
  // all-reduce, as the communication engine ran it, is "all_reduce" on the communication track.
  void set_tracer(Tracer* tracer) { tracer_ = tracer; }

 private:
  void launch_ready_buckets(bool from_finish);
  void record(DdpEvent e);

  Communicator& comm_;
  float* grads_;
  std::int64_t numel_;
  DdpOptions options_;
  std::vector<GradBucket> buckets_;

  bool in_step_ = false;
  bool sync_ = false;
  std::vector<std::int64_t> ready_;           // elements marked, per bucket
  std::map<std::int64_t, std::int64_t> marked_;  // begin -> end of the ranges marked this step
  int next_launch_ = 0;
  std::vector<std::unique_ptr<CommWork>> work_;  // per bucket, once launched
  std::vector<bool> done_;

  DdpStats last_, total_;
  Tracer* tracer_ = nullptr;
  mutable std::mutex events_mu_;
  std::vector<DdpEvent> events_;
};

}  // namespace scalelab
