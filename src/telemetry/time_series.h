#pragma once
// Telemetry time series: every reading is one point of a named series (source, device, metric).
//
// The long format (t_s, source, device, metric, value) is what the lab stores in its
// telemetry_samples table and what the summary and the CSV writer consume. Internally the three
// names are interned once per series so that an hour of sampling is a vector of (t, id, value).
//
// Names used by the sources (see docs/telemetry.md for the full list):
//   source  "nvml", "nvidia-smi", "engine": device "cuda:<ordinal>" (or the engine's device name)
//           "process": device "process" (the followed process tree)
//           "host": device "host" (CPU, memory), "rapl:<zone>" (package energy),
//                   "hwmon:<chip>/<sensor>" (temperatures)
//   metric  snake_case with its unit as suffix: gpu_util_pct, mem_used_bytes, power_w, energy_j...
// Metrics whose name ends in "energy_j" are cumulative counters (the summary takes last - first).
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace scalelab {

// One reading in long format.
struct Sample {
  double t_s = 0;      // seconds since the session started (steady clock)
  std::string source;  // "nvml", "nvidia-smi", "process", "host", "engine"
  std::string device;  // "cuda:0", "process", "host", "rapl:package-0", ...
  std::string metric;  // "gpu_util_pct", "mem_used_bytes", ...
  double value = 0;
};

struct SeriesKey {
  std::string source, device, metric;
  bool operator<(const SeriesKey& o) const {
    return std::tie(source, device, metric) < std::tie(o.source, o.device, o.metric);
  }
  bool operator==(const SeriesKey& o) const = default;
};

// One series' points in time order.
struct SeriesPoints {
  std::vector<double> t_s;
  std::vector<double> value;
};

// Thread-safe store of all series of a session. Appends come from the sampler thread (and the
// nvidia-smi reader thread); readers take a copy.
class TimeSeries {
 public:
  TimeSeries() = default;
  // Builds a store from long-format samples (e.g. read back from the results database).
  explicit TimeSeries(const std::vector<Sample>& samples);

  void append(const std::string& source, const std::string& device, const std::string& metric,
              double t_s, double value);

  // All readings in long format, ordered by time, then by series (source, device, metric).
  std::vector<Sample> samples() const;
  // Every series with its points, keyed by (source, device, metric).
  std::map<SeriesKey, SeriesPoints> series() const;
  // The most recent point (by time) of every series: the "current" readings, for live displays.
  std::map<SeriesKey, std::pair<double, double>> latest() const;  // key -> (t_s, value)
  std::size_t size() const;
  bool empty() const { return size() == 0; }
  void clear();

 private:
  std::uint32_t id_locked(const std::string& source, const std::string& device,
                          const std::string& metric);

  struct Point {
    double t_s;
    std::uint32_t series;
    double value;
  };
  mutable std::mutex mu_;
  std::vector<SeriesKey> keys_;
  std::map<SeriesKey, std::uint32_t> ids_;
  std::vector<Point> points_;
};

}  // namespace scalelab
