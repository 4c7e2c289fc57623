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
  // differ by device (the fused loss's default chunk, the NF4 tile). Ignored on real devices.
  DeviceType planned_device = DeviceType::kCPU;
  // The device whose choices a tensor on `d` follows: `d` itself, or the planned device on meta.
  DeviceType run_device(DeviceType d) const { return d == DeviceType::kMeta ? planned_device : d; }
};

class Tracer;

// Op scopes timed on an asynchronous device's queue (CUDA events) instead of by synchronizing:
// ProfileScope marks its start and end on the device's queue; flush(), called once the device has
// been synchronized (the trainer: at the end of each step), reads when the device reached each
// mark and adds the scopes to the Profiler (per-family table) and the Tracer (complete events of
// category "op" on the track "GPU: op families (CUDA events)", device time placed on the host's
// time base from the window's first mark). The host never waits inside a step, so the profiled
// run keeps the overlap of host and device that an unprofiled one has, and each family's time is
// the time the device spent between its first and last kernel.
class DeviceTiming {
 public:
  // Synchronizes the device (through the timer) and opens the first window.
  DeviceTiming(DeviceTimer& timer, Profiler* profiler, Tracer* tracer);
  int mark() { return timer_.mark(); }
  void record(const char* family, Phase phase, int start_mark, int end_mark);
  // Synchronizes, turns the window's scopes into profiler rows and trace events, opens a new window.
  void flush();
  std::size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    const char* family;
    Phase phase;
    int start, end;
  };
  void open_window();
  DeviceTimer& timer_;
  Profiler* profiler_;
  Tracer* tracer_;
  int track_ = -1;
  std::chrono::steady_clock::time_point window_start_;
  std::vector<Pending> pending_;
};

struct ExecContext {
  DeviceAllocator* alloc = nullptr;
  Profiler* profiler = nullptr;  // null: not profiling
  DeviceOptions options{};       // read by kernels: ctx.options.allow_tf32
  Tracer* tracer = nullptr;      // null: no timeline (core/trace.h)
  // Where scopes also open named ranges for an external profiler (the CUDA runtime: NVTX, which
  // nsys shows); null: none. The trainer sets it on CUDA, with or without --profile / --trace.
  DeviceRuntime* ranges = nullptr;
  // Set when op scopes on an asynchronous device are timed with its queue's timer (CUDA events)
  // rather than by synchronizing around each scope; null otherwise.
  DeviceTiming* device_timing = nullptr;
  // The training micro-step of the forward/backward running now, for the dropout of the shared
  // decoder pieces (LoRA's --lora-dropout, model/decoder/lora.h): >= 0 while the trainer (or the
  // memory plan) runs forward_backward, −1 otherwise (evaluation, generation): no dropout then.
  // train_seed keys the masks (--seed).
  std::int64_t train_step = -1;
  std::uint64_t train_seed = 0;
  DeviceType device() const { return alloc->device(); }
  // Whether scopes record anything (timing) — ranges alone need no clock.
  bool timing() const { return profiler != nullptr || tracer != nullptr; }
};

// Times a scope into ctx.profiler (the per-family table) and ctx.tracer (the timeline, as a
// complete event of category "op" named after the family, args.phase) when either is on, and
// opens a named range on ctx.ranges (NVTX on CUDA) when set; free otherwise.
//
// The clock is the host's wall clock on the CPU. On an asynchronous device (CUDA) the host returns
// from a kernel launch before the kernel has run, so there the scope is timed on the device's
// queue when ctx.device_timing is set (CUDA events: no stall, see DeviceTiming); without it, it
// synchronizes the device at its start and at its end, so that each scope measures the kernels it
// queued (and the launch overhead), at the cost of the overlap between host and device. The meta
// device runs nothing and a CPU scope needs no synchronization.
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
  DeviceRuntime* sync_ = nullptr;  // set when timing on an asynchronous device by synchronizing
  DeviceTiming* timing_ = nullptr;  // set when timing on an asynchronous device's queue
  int start_mark_ = -1;
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
