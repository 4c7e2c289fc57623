#pragma once
// The execution context every op receives last: which device, its allocator, and the profiler.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

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

class Tracer;

struct ExecContext {
  DeviceAllocator* alloc = nullptr;
  Profiler* profiler = nullptr;  // null: not profiling
  DeviceOptions options{};       // read by kernels: ctx.options.allow_tf32
  Tracer* tracer = nullptr;      // null: no timeline (core/trace.h)
  // Where scopes also open named ranges for an external profiler (the CUDA runtime: NVTX, which
  // nsys shows); null: none. The trainer sets it on CUDA, with or without --profile / --trace.
  DeviceRuntime* ranges = nullptr;
  DeviceType device() const { return alloc->device(); }
  // Whether scopes record anything (timing) — ranges alone need no clock.
  bool timing() const { return profiler != nullptr || tracer != nullptr; }
};

// Times a scope into ctx.profiler (the per-family table) and ctx.tracer (the timeline, as a
// complete event of category "op" named after the family, args.phase) when either is on, and
// opens a named range on ctx.ranges (NVTX on CUDA) when set; free otherwise.
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
  Tracer* tracer_;
  DeviceRuntime* ranges_;
  const char* family_;
  Phase phase_;
  DeviceRuntime* sync_ = nullptr;  // set when timing on an asynchronous device
  int uncaught_ = 0;               // std::uncaught_exceptions() at the start
  std::chrono::steady_clock::time_point start_;
};

// A named region of the step on the timeline and in external profilers, not in the per-family
// table: a phase ("forward", "backward", "head", "optimizer", ...; category "phase") or a layer
// ("layer 3", category "layer", args.index 3). Regions nest around op scopes. Recorded when
// ctx.tracer is set, ranged when ctx.ranges is set; otherwise nothing is built (the name is
// formatted only when needed). No device synchronization: a region's time on CUDA is the host's
// (the ops inside it synchronize when timing).
class RegionScope {
 public:
  RegionScope(const ExecContext& ctx, const char* name, Phase phase);
  RegionScope(const ExecContext& ctx, const char* kind, std::int64_t index, Phase phase);  // "layer", 3
  ~RegionScope();
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  void open(std::string name);
  Tracer* tracer_;
  DeviceRuntime* ranges_;
  const char* cat_;
  Phase phase_;
  std::int64_t index_ = -1;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace scalelab
