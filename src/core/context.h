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

// Per-run switches that kernels of some devices read (the CLI sets them; a kernel that has no use
// for one ignores it). Kept here, beside the context every op receives, so that code built without
// a device's toolkit never has to call into that device's library to pass a switch on.
struct DeviceOptions {
  // CUDA: fp32 GEMMs may use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation), as
  // torch.backends.cuda.matmul.allow_tf32. Off by default: fp32 means fp32. The CPU ignores it.
  bool allow_tf32 = false;
  // On the meta device (the memory plan): the device whose size choices kernels mirror, where they
  // differ by device (the fused loss's default chunk). Ignored on real devices.
  DeviceType planned_device = DeviceType::kCPU;
};

struct ExecContext {
  DeviceAllocator* alloc = nullptr;
  Profiler* profiler = nullptr;  // null: not profiling
  DeviceOptions options{};       // read by kernels: ctx.options.allow_tf32
  DeviceType device() const { return alloc->device(); }
};

// Times a scope into ctx.profiler when profiling is on; free otherwise.
//
// The clock is the host's wall clock. On an asynchronous device (CUDA) the host returns from a
// kernel launch before the kernel has run, so when profiling on CUDA the scope synchronizes the
// device at its start and at its end: each scope then measures the kernels it queued (and the
// launch overhead), at the cost of the overlap between host and device that an unprofiled run
// keeps — profiled steps are slower than unprofiled ones, and the per-family split is what counts.
// (CUDA events recorded on the stream would time the kernels without stalling the host: a later
// improvement.) The meta device runs nothing and a CPU scope needs no synchronization.
class ProfileScope {
 public:
  ProfileScope(const ExecContext& ctx, const char* family, Phase phase);
  // noexcept(false): synchronizing at the end reports a failed kernel as the exception the device
  // runtime throws (unless the scope is already being left by an exception).
  ~ProfileScope() noexcept(false);
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* prof_;
  const char* family_;
  Phase phase_;
  DeviceRuntime* sync_ = nullptr;  // set when profiling on an asynchronous device
  int uncaught_ = 0;               // std::uncaught_exceptions() at the start
  std::chrono::steady_clock::time_point start_;
};

}  // namespace scalelab
