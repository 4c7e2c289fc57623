#include "core/context.h"

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
    : prof_(ctx.profiler), family_(family), phase_(phase) {
  if (!prof_) return;
  if (ctx.alloc != nullptr && ctx.device() == DeviceType::kCUDA) {
    sync_ = &device_runtime(DeviceType::kCUDA);
    // Work queued before this scope must not be counted in it.
    sync_->synchronize();
  }
  uncaught_ = std::uncaught_exceptions();
  start_ = std::chrono::steady_clock::now();
}

ProfileScope::~ProfileScope() noexcept(false) {
  if (!prof_) return;
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
  prof_->add(family_, phase_, std::chrono::duration<double>(end - start_).count());
}

double Profiler::total_seconds() const {
  double t = 0;
  for (const auto& [key, e] : entries_) t += e.seconds;
  return t;
}

}  // namespace scalelab
