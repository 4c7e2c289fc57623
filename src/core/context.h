#pragma once
// The execution context every op receives last: which device, its allocator, and the profiler.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace scalelab {

enum class Phase : std::uint8_t { kForward, kBackward, kOptimizer, kData, kComm, kOther };
const char* phase_name(Phase p);

// Accumulates wall time per (op family, phase): the CPU analogue of an nsys summary.
class Profiler {
 public:
  struct Entry {
    double seconds = 0;
    std::int64_t calls = 0;
  };
  void add(const std::string& family, Phase phase, double seconds);
  // Rows sorted by time, descending.
  struct Row {
    std::string family;
    Phase phase;
    Entry entry;
  };
  std::vector<Row> rows() const;
  double total_seconds() const;
  void clear() { entries_.clear(); }

 private:
  std::map<std::pair<std::string, Phase>, Entry> entries_;
};

struct ExecContext {
  DeviceAllocator* alloc = nullptr;
  Profiler* profiler = nullptr;  // null: not profiling
  DeviceType device() const { return alloc->device(); }
};

// Times a scope into ctx.profiler when profiling is on; free otherwise.
class ProfileScope {
 public:
  ProfileScope(const ExecContext& ctx, const char* family, Phase phase)
      : prof_(ctx.profiler), family_(family), phase_(phase) {
    if (prof_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (prof_) {
      const auto end = std::chrono::steady_clock::now();
      prof_->add(family_, phase_, std::chrono::duration<double>(end - start_).count());
    }
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* prof_;
  const char* family_;
  Phase phase_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace scalelab
