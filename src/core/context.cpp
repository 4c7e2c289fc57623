#include "core/context.h"

#include "core/trace.h"

#include <algorithm>
#include <exception>

namespace scalelab {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kData: return "data";
    case Phase::kComm: return "comm";
    case Phase::kOther: return "other";
  }
  return "?";
}

void Profiler::add(const std::string& family, Phase phase, double seconds) {
  auto& e = entries_[{family, phase}];
  e.seconds += seconds;
  e.calls += 1;
}

std::vector<Profiler::Row> Profiler::rows() const {
  std::vector<Row> out;
  for (const auto& [key, e] : entries_) out.push_back(Row{key.first, key.second, e});
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.entry.seconds > b.entry.seconds; });
  return out;
}

ProfileScope::ProfileScope(const ExecContext& ctx, const char* family, Phase phase)
    : prof_(ctx.profiler), tracer_(ctx.tracer), ranges_(ctx.ranges), family_(family), phase_(phase) {
  if (ranges_) ranges_->range_push(family);
  if (!prof_ && !tracer_) return;
  if (ctx.device_timing != nullptr && ctx.alloc != nullptr && ctx.device() != DeviceType::kCPU) {
    timing_ = ctx.device_timing;
    uncaught_ = std::uncaught_exceptions();
    start_mark_ = timing_->mark();
    return;
  }
  if (ctx.alloc != nullptr && ctx.device() == DeviceType::kCUDA) {
    sync_ = &device_runtime(DeviceType::kCUDA);
    // Work queued before this scope must not be counted in it.
    sync_->synchronize();
  }
  uncaught_ = std::uncaught_exceptions();
  start_ = std::chrono::steady_clock::now();
}

ProfileScope::~ProfileScope() noexcept(false) {
  if (ranges_) ranges_->range_pop();
  if (!prof_ && !tracer_) return;
  if (timing_) {
    // Leaving by an exception: the scope is not recorded (its kernels may not have run).
    if (std::uncaught_exceptions() == uncaught_) timing_->record(family_, phase_, start_mark_, timing_->mark());
    return;
  }
  if (sync_) {
    if (std::uncaught_exceptions() > uncaught_) {
      // Leaving by an exception already: report that one, not a second from the device.
      try {
        sync_->synchronize();
      } catch (...) {
      }
      return;
    }
    sync_->synchronize();  // the scope's kernels are done: now the clock means something
  }
  const auto end = std::chrono::steady_clock::now();
  if (prof_) prof_->add(family_, phase_, std::chrono::duration<double>(end - start_).count());
  if (tracer_) tracer_->complete(family_, "op", start_, end, phase_name(phase_));
}

RegionScope::RegionScope(const ExecContext& ctx, const char* name, Phase phase)
    : tracer_(ctx.tracer), ranges_(ctx.ranges), cat_("phase"), phase_(phase) {
  if (tracer_ || ranges_) open(name);
}

RegionScope::RegionScope(const ExecContext& ctx, const char* kind, std::int64_t index, Phase phase)
    : tracer_(ctx.tracer), ranges_(ctx.ranges), cat_("layer"), phase_(phase), index_(index) {
  if (tracer_ || ranges_) open(std::string(kind) + " " + std::to_string(index));
}

void RegionScope::open(std::string name) {
  name_ = std::move(name);
  if (ranges_) ranges_->range_push(name_.c_str());
  if (tracer_) start_ = std::chrono::steady_clock::now();
}

RegionScope::~RegionScope() {
  if (ranges_) ranges_->range_pop();
  if (tracer_) {
    tracer_->complete(std::move(name_), cat_, start_, std::chrono::steady_clock::now(), phase_name(phase_), index_);
  }
}

DeviceTiming::DeviceTiming(DeviceTimer& timer, Profiler* profiler, Tracer* tracer)
    : timer_(timer), profiler_(profiler), tracer_(tracer) {
  if (tracer_) track_ = tracer_->track("GPU: op families (CUDA events)");
  timer_.collect();  // waits for what was queued before, starts a window
  open_window();
}

void DeviceTiming::open_window() {
  pending_.clear();
  // The device is idle (collect() waited for it): mark 0 is reached as soon as it is queued, so
  // the host's clock now is the device time origin of the window (to within a launch latency).
  window_start_ = std::chrono::steady_clock::now();
  timer_.mark();
}

void DeviceTiming::record(const char* family, Phase phase, int start_mark, int end_mark) {
  pending_.push_back({family, phase, start_mark, end_mark});
}

void DeviceTiming::flush() {
  const std::vector<double> at = timer_.collect();
  const double origin = tracer_ ? tracer_->us(window_start_) : 0.0;
  for (const Pending& p : pending_) {
    if (p.start < 0 || p.end < 0 || static_cast<std::size_t>(std::max(p.start, p.end)) >= at.size()) continue;
    const double t0 = at[static_cast<std::size_t>(p.start)];
    const double dur = std::max(0.0, at[static_cast<std::size_t>(p.end)] - t0);
    if (profiler_) profiler_->add(p.family, p.phase, dur * 1e-6);
    if (tracer_) tracer_->complete_us(p.family, "op", origin + t0, dur, track_, phase_name(p.phase));
  }
  open_window();
}

double Profiler::total_seconds() const {
  double t = 0;
  for (const auto& [key, e] : entries_) t += e.seconds;
  return t;
}

}  // namespace scalelab
