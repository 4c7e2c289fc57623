#pragma once
// The host source: the machine as a whole, from /proc and /sys.
//
// Series (source "host"):
//   device "host":                cpu_util_pct (busy share of all cores, 0..100, /proc/stat),
//                                 mem_used_bytes (MemTotal - MemAvailable), mem_total_bytes
//   device "rapl:<zone>":         energy_j (package energy since the session started, from
//                                 /sys/class/powercap/intel-rapl:N/energy_uj, counter wrap at
//                                 max_energy_range_uj handled), power_w (over the interval)
//   device "hwmon:<chip>/<sensor>": temperature_c (/sys/class/hwmon/hwmonN/tempM_input)
// RAPL and hwmon are optional: where the machine has none (VMs, containers) or they are not
// readable (energy_uj is root-only on recent kernels), a note says so and the rest carries on.
#include <optional>
#include <string>
#include <vector>

#include "telemetry/proc.h"
#include "telemetry/source.h"

namespace scalelab {

// Energy counter difference in microjoules, with wrap-around at max_range (0: unknown, a
// decrease is then not a wrap and gives nullopt).
std::optional<unsigned long long> rapl_delta_uj(unsigned long long prev, unsigned long long cur,
                                                unsigned long long max_range);

class HostSource : public TelemetrySource {
 public:
  struct Options {
    std::string proc_root = "/proc";
    std::string sys_root = "/sys";
    bool rapl = true;
    bool hwmon = true;
    std::size_t max_hwmon_sensors = 32;  // bounds the cost of a tick on sensor-rich machines
  };

  explicit HostSource(Options options);

  std::string name() const override { return "host"; }
  std::string open() override;
  void sample(double t_s, TimeSeries& out) override;

  // "rapl:package-0", ... and "hwmon:coretemp/Package id 0", ... found by open().
  std::vector<std::string> rapl_devices() const;
  std::vector<std::string> hwmon_devices() const;

 private:
  struct RaplZone {
    std::string device;  // "rapl:package-0"
    std::string energy_path;
    unsigned long long max_range_uj = 0;
    unsigned long long prev_uj = 0;
    double energy_j = 0;  // accumulated since open()
    TelemetryClock::time_point prev_time{};
    bool failed = false;
  };
  struct Sensor {
    std::string device;  // "hwmon:coretemp/Core 0"
    std::string input_path;
    bool failed = false;
  };
  void open_rapl();
  void open_hwmon();

  Options options_;
  std::optional<CpuTimes> prev_cpu_;
  TelemetryClock::time_point prev_cpu_time_{};
  std::vector<RaplZone> rapl_;
  std::vector<Sensor> sensors_;
};

}  // namespace scalelab
