#include "distributed/ddp.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/trace.h"

namespace scalelab {
namespace {

double overlap_s(CommClock::time_point a0, CommClock::time_point a1, CommClock::time_point b0,
                 CommClock::time_point b1) {
  const auto lo = std::max(a0, b0);
  const auto hi = std::min(a1, b1);
  return hi > lo ? std::chrono::duration<double>(hi - lo).count() : 0.0;
}

}  // namespace

DdpStats& DdpStats::operator+=(const DdpStats& o) {
  steps += o.steps;
  buckets += o.buckets;
  launched_early += o.launched_early;
  bytes += o.bytes;
  comm_s += o.comm_s;
  exposed_s += o.exposed_s;
  hidden_s += o.hidden_s;
  blocked_s += o.blocked_s;
  return *this;
}

const char* ddp_event_name(DdpEvent::Kind k) {
  switch (k) {
    case DdpEvent::Kind::kMarkReady: return "mark_ready";
    case DdpEvent::Kind::kLaunch: return "launch";
    case DdpEvent::Kind::kDone: return "done";
    case DdpEvent::Kind::kFinishBegin: return "finish_begin";
    case DdpEvent::Kind::kFinishEnd: return "finish_end";
  }
  return "?";
}

std::vector<GradBucket> plan_grad_buckets(std::int64_t numel, std::size_t elem_bytes, double first_bucket_mb,
                                          double bucket_mb, std::int64_t align) {
  SCALELAB_CHECK_INPUT(bucket_mb > 0 && std::isfinite(bucket_mb),
                       "[ddp] --ddp-bucket-mb must be a positive number of MiB (got " + std::to_string(bucket_mb) + ")");
  SCALELAB_CHECK_INPUT(first_bucket_mb > 0 && std::isfinite(first_bucket_mb),
                       "[ddp] the first bucket size must be a positive number of MiB (got " +
                           std::to_string(first_bucket_mb) + ")");
  SCALELAB_CHECK(numel >= 0 && elem_bytes > 0 && align >= 1, "[ddp] plan_grad_buckets: bad arguments");
  auto elems = [&](double mb) {
    std::int64_t n = static_cast<std::int64_t>(mb * 1024.0 * 1024.0 / static_cast<double>(elem_bytes));
    n = n / align * align;
    return std::max<std::int64_t>(n, align);
  };
  const std::int64_t first = elems(first_bucket_mb);
  const std::int64_t rest = elems(bucket_mb);
  std::vector<GradBucket> out;
  std::int64_t end = numel;
  while (end > 0) {
    // Rounding the start down to a multiple of `align` (from the buffer's start) keeps every
    // boundary but the buffer's end aligned; a bucket is then up to align-1 elements larger.
    std::int64_t begin = end - (out.empty() ? first : rest);
    begin = begin <= 0 ? 0 : begin / align * align;
    out.push_back({static_cast<int>(out.size()), begin, end});
    end = begin;
  }
  return out;
}

GradReducer::GradReducer(Communicator& comm, float* grads, std::int64_t numel, DdpOptions options)
    : comm_(comm), grads_(grads), numel_(numel), options_(options) {
  SCALELAB_CHECK(numel >= 0 && (grads != nullptr || numel == 0), "[ddp] GradReducer: no gradient buffer");
  buckets_ = plan_grad_buckets(numel, sizeof(float), options.first_bucket_mb, options.bucket_mb);
  ready_.assign(buckets_.size(), 0);
  done_.assign(buckets_.size(), false);
  work_.resize(buckets_.size());
}

GradReducer::~GradReducer() = default;

void GradReducer::record(DdpEvent e) {
  std::lock_guard<std::mutex> lk(events_mu_);
  events_.push_back(e);
}

std::vector<DdpEvent> GradReducer::events() const {
  std::lock_guard<std::mutex> lk(events_mu_);
  return events_;
}

void GradReducer::begin_step(bool sync) {
  SCALELAB_CHECK(!(in_step_ && sync_ && next_launch_ > 0),
                 "[ddp] begin_step: the previous synchronized step launched all-reduces but finish() "
                 "was not called — call finish() after every backward of a synchronized step");
  in_step_ = true;
  sync_ = sync;
  if (sync) last_ = DdpStats{};
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(done_.begin(), done_.end(), false);
  for (auto& w : work_) w.reset();
  marked_.clear();
  next_launch_ = 0;
  std::lock_guard<std::mutex> lk(events_mu_);
  events_.clear();
}

void GradReducer::mark_ready(std::int64_t begin, std::int64_t end) {
  SCALELAB_CHECK(in_step_, "[ddp] mark_ready before begin_step — call begin_step(sync) at every micro-step");
  SCALELAB_CHECK(0 <= begin && begin <= end && end <= numel_,
                 "[ddp] mark_ready: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") outside the gradient buffer of " + std::to_string(numel_) + " elements");
  if (!sync_ || begin == end) return;
  // Ranges must not overlap within a step (a double mark would launch a bucket too early).
  auto next = marked_.lower_bound(begin);
  if (next != marked_.end() && next->first < end)
    throw RuntimeError("[ddp] mark_ready: [" + std::to_string(begin) + ", " + std::to_string(end) +
                       ") overlaps [" + std::to_string(next->first) + ", " + std::to_string(next->second) +
                       ") marked earlier in this step");
  if (next != marked_.begin()) {
    auto prev = std::prev(next);
    if (prev->second > begin)
      throw RuntimeError("[ddp] mark_ready: [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") overlaps [" + std::to_string(prev->first) + ", " + std::to_string(prev->second) +
                         ") marked earlier in this step");
  }
  marked_[begin] = end;
  record({DdpEvent::Kind::kMarkReady, -1, begin, end});
  // Buckets are in decreasing address order: bucket i covers [buckets_[i].begin, buckets_[i].end).
  for (auto& b : buckets_) {
    const std::int64_t lo = std::max(b.begin, begin), hi = std::min(b.end, end);
    if (hi > lo) ready_[static_cast<std::size_t>(b.index)] += hi - lo;
  }
  launch_ready_buckets(false);
}

void GradReducer::launch_ready_buckets(bool from_finish) {
  const ReduceOp op = options_.average ? ReduceOp::kAvg : ReduceOp::kSum;
  while (next_launch_ < static_cast<int>(buckets_.size()) &&
         ready_[static_cast<std::size_t>(next_launch_)] == buckets_[static_cast<std::size_t>(next_launch_)].numel()) {
    const GradBucket& b = buckets_[static_cast<std::size_t>(next_launch_)];
    const auto t0 = tracer_ ? CommClock::now() : CommClock::time_point{};
    work_[static_cast<std::size_t>(b.index)] = comm_.all_reduce_async(grads_ + b.begin, b.numel(), CommDType::kF32, op);
    if (tracer_) {
      tracer_->complete("all_reduce launch", "comm", t0, CommClock::now(), "comm", b.index,
                        b.numel() * static_cast<std::int64_t>(sizeof(float)));
    }
    record({DdpEvent::Kind::kLaunch, b.index, b.begin, b.end});
    ++last_.buckets;
    if (!from_finish) ++last_.launched_early;
    last_.bytes += b.numel() * static_cast<std::int64_t>(sizeof(float));
    ++next_launch_;
  }
}

bool GradReducer::bucket_done(int i) {
  SCALELAB_CHECK(i >= 0 && i < static_cast<int>(buckets_.size()), "[ddp] bucket_done: no bucket " + std::to_string(i));
  if (done_[static_cast<std::size_t>(i)]) return true;
  auto& w = work_[static_cast<std::size_t>(i)];
  if (!w) return false;
  if (!done_[static_cast<std::size_t>(i)] && w->done()) {
    done_[static_cast<std::size_t>(i)] = true;
    record({DdpEvent::Kind::kDone, i, buckets_[static_cast<std::size_t>(i)].begin, buckets_[static_cast<std::size_t>(i)].end});
  }
  return done_[static_cast<std::size_t>(i)];
}

void GradReducer::finish() {
  SCALELAB_CHECK(in_step_, "[ddp] finish before begin_step — call begin_step(sync) at every micro-step");
  in_step_ = false;
  if (!sync_) return;
  const auto t0 = CommClock::now();
  record({DdpEvent::Kind::kFinishBegin});
  // Whatever backward did not mark is final now.
  std::int64_t at = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> gaps;
  for (const auto& [b, e] : marked_) {
    if (b > at) gaps.emplace_back(at, b);
    at = e;
  }
  if (at < numel_) gaps.emplace_back(at, numel_);
  for (const auto& [b, e] : gaps)
    for (auto& bk : buckets_) {
      const std::int64_t lo = std::max(bk.begin, b), hi = std::min(bk.end, e);
      if (hi > lo) ready_[static_cast<std::size_t>(bk.index)] += hi - lo;
    }
  launch_ready_buckets(true);
  SCALELAB_CHECK(next_launch_ == static_cast<int>(buckets_.size()), "[ddp] finish: not every bucket could be launched (a bug)");
  for (std::size_t i = 0; i < work_.size(); ++i) {
    work_[i]->wait();
    if (!done_[i]) {
      done_[i] = true;
      record({DdpEvent::Kind::kDone, static_cast<int>(i), buckets_[i].begin, buckets_[i].end});
    }
  }
  const auto t1 = CommClock::now();
  record({DdpEvent::Kind::kFinishEnd});
  if (tracer_) {
    tracer_->complete("ddp wait", "comm", t0, t1, "comm");
    for (std::size_t i = 0; i < work_.size(); ++i) {
      tracer_->complete("all_reduce", "comm", work_[i]->started(), work_[i]->finished(), "comm",
                        static_cast<std::int64_t>(i), buckets_[i].numel() * static_cast<std::int64_t>(sizeof(float)),
                        Tracer::kCommTid);
    }
  }
  for (auto& w : work_) {
    last_.comm_s += w->seconds();
    last_.exposed_s += overlap_s(w->started(), w->finished(), t0, t1);
  }
  last_.hidden_s = std::max(0.0, last_.comm_s - last_.exposed_s);
  last_.blocked_s = std::chrono::duration<double>(t1 - t0).count();
  last_.steps = 1;
  total_ += last_;  // last_ keeps this step's figures until the next synchronized step begins
  next_launch_ = 0;
  for (auto& w : work_) w.reset();
}

}  // namespace scalelab
