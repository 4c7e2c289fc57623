#pragma once
// The NVML source: per-GPU readings from libnvidia-ml, loaded at run time with dlopen (no nvml.h,
// no link-time dependency; see nvml_abi.h), matched to CUDA ordinals by UUID honouring
// CUDA_VISIBLE_DEVICES.
//
// Every field is optional: a function the driver lacks (missing symbol), or that answers
// NOT_SUPPORTED / NO_PERMISSION, leaves the field empty for the rest of the session; a device that
// answers GPU_IS_LOST is dropped with one note; nothing here fails the run.
//
// Series (source "nvml", device "cuda:<ordinal>"), units in the name:
//   gpu_util_pct, mem_util_pct          nvmlDeviceGetUtilizationRates
//   mem_total_bytes, mem_used_bytes,    nvmlDeviceGetMemoryInfo_v2 (mem_reserved_bytes too), or
//   mem_reserved_bytes                  nvmlDeviceGetMemoryInfo (v1) on a version mismatch/absence
//   temperature_c                       nvmlDeviceGetTemperature (GPU sensor)
//   power_w                             nvmlDeviceGetPowerUsage (mW / 1000)
//   energy_j                            nvmlDeviceGetTotalEnergyConsumption (mJ / 1000, counter)
//   sm_clock_mhz, mem_clock_mhz         nvmlDeviceGetClockInfo
//   pcie_tx_kb_s, pcie_rx_kb_s          nvmlDeviceGetPcieThroughput (KB/s over 20 ms)
//   clocks_event_reasons                nvmlDeviceGetCurrentClocksEventReasons (bit mask, as a number)
//   num_processes                       nvmlDeviceGetComputeRunningProcesses_v2 (or v1)
//   process_mem_used_bytes              the same, summed over the followed process tree's pids
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "telemetry/source.h"

namespace scalelab {

// One visible GPU.
struct GpuInfo {
  int ordinal = 0;           // CUDA ordinal in the observed process
  std::string device;        // "cuda:<ordinal>"
  unsigned nvml_index = 0;   // NVML / nvidia-smi index
  std::string name;          // "NVIDIA H100 80GB HBM3"
  std::string uuid;          // "GPU-..."
};

// One device's fields at one instant; empty where the driver gives nothing.
struct GpuReading {
  std::string device;
  std::optional<double> gpu_util_pct, mem_util_pct;
  std::optional<double> mem_total_bytes, mem_used_bytes, mem_reserved_bytes;
  std::optional<double> temperature_c, power_w, energy_j;
  std::optional<double> sm_clock_mhz, mem_clock_mhz;
  std::optional<double> pcie_tx_kb_s, pcie_rx_kb_s;
  std::optional<double> clocks_event_reasons;
  std::optional<double> num_processes, process_mem_used_bytes;

  // (metric, value) of the fields that have a value, in the order declared above.
  std::vector<std::pair<std::string, double>> fields() const;
};

// Names of the clock-event (throttle) reasons set in `mask` ("sw_power_cap", "hw_slowdown", ...).
std::vector<std::string> clocks_event_reason_names(unsigned long long mask);
// The reasons that mean the clocks are held down by power, heat or a slowdown (everything except
// idle, application clock settings and display clock settings).
unsigned long long clocks_event_throttle_mask();

class NvmlSource : public TelemetrySource {
 public:
  struct Options {
    // Path or soname to dlopen. Empty: $SCALELAB_NVML_LIBRARY if set, else "libnvidia-ml.so.1".
    std::string library;
    // CUDA_VISIBLE_DEVICES of the observed process. When cuda_visible_from_env, this process's
    // environment is read at open(); otherwise `cuda_visible_devices` is used (nullopt = unset).
    bool cuda_visible_from_env = true;
    std::optional<std::string> cuda_visible_devices;
    // Pids of the followed process tree, for process_mem_used_bytes (may be null).
    std::function<std::vector<int>()> followed_pids;
  };

  explicit NvmlSource(Options options);
  ~NvmlSource() override;
  NvmlSource(const NvmlSource&) = delete;
  NvmlSource& operator=(const NvmlSource&) = delete;

  std::string name() const override { return "nvml"; }
  std::string open() override;
  void sample(double t_s, TimeSeries& out) override;
  void close() override;

  // The visible devices, by CUDA ordinal (after a successful open()).
  const std::vector<GpuInfo>& devices() const;
  // Reads every visible, not-lost device now. `t_s` only labels notes.
  std::vector<GpuReading> read(double t_s);
  // Per device, the metrics it does not give and why ("temperature_c": "not supported").
  std::map<std::string, std::map<std::string, std::string>> unavailable_fields() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalelab
