#pragma once
// The engine source: the native trainer's own memory counters, read through a callback so that
// telemetry does not depend on the trainer (the analogue of torch.cuda.memory_allocated /
// memory_reserved next to NVML's view of the same device).
//
// Series (source "engine", device = the probe's device name, "cuda:0" or "cpu"):
//   allocated_bytes, reserved_bytes, peak_allocated_bytes, peak_reserved_bytes, capacity_bytes
// A callback that throws is noted once and not called again; the rest carries on.
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "telemetry/source.h"

namespace scalelab {

struct EngineProbe {
  std::string device;                  // the name the GPU sources use: "cuda:<ordinal>", or "cpu"
  std::function<MemoryStats()> stats;  // e.g. [&alloc] { return alloc.stats(); }; must be
                                       // callable from the sampler thread (DeviceAllocator is)
};

class EngineSource : public TelemetrySource {
 public:
  explicit EngineSource(std::vector<EngineProbe> probes);

  std::string name() const override { return "engine"; }
  std::string open() override;
  void sample(double t_s, TimeSeries& out) override;

 private:
  std::vector<EngineProbe> probes_;
  std::vector<bool> failed_;
};

}  // namespace scalelab
