#pragma once
// The nvidia-smi source: a second, independent reading of the GPUs, to check NVML against.
//
// One long-lived `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits -lms <interval>`
// process streams one line per GPU per interval (nvidia-smi's own loop: starting nvidia-smi at
// every tick would cost far more CPU than the sampling is allowed to). A reader thread parses the
// lines as they come and stamps each with its arrival time. Before that, a one-shot query of
// index and uuid checks that nvidia-smi works and maps its devices to CUDA ordinals.
//
// Series (source "nvidia-smi", device "cuda:<ordinal>"): gpu_util_pct, mem_util_pct,
// mem_total_bytes, mem_used_bytes (MiB * 2^20), temperature_c, power_w, sm_clock_mhz,
// mem_clock_mhz. Values "[N/A]", "[Not Supported]", "N/A" and the like are left out.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/subprocess.h"
#include "telemetry/source.h"

namespace scalelab {

struct NvidiaSmiField {
  const char* query;   // nvidia-smi field name
  const char* metric;  // our metric name ("" for index/uuid/name)
  double scale;        // value * scale = metric value
};

// The fields queried, in the order they appear in each line.
const std::vector<NvidiaSmiField>& nvidia_smi_fields();
// "--query-gpu=index,uuid,name,..."
std::string nvidia_smi_query_argument();

struct NvidiaSmiRow {
  unsigned index = 0;
  std::string uuid, name;
  std::vector<std::pair<std::string, double>> values;  // (metric, value), missing ones left out
};

// True for nvidia-smi's placeholders of a value it does not have ("[N/A]", "[Not Supported]",
// "N/A", "[Unknown Error]", "[GPU is lost]", ...).
bool nvidia_smi_value_missing(const std::string& text);

// Parses one line of the query output for nvidia_smi_fields(). nullopt when the line is not a data
// line of that shape (an error message, a truncated line).
std::optional<NvidiaSmiRow> parse_nvidia_smi_line(const std::string& line);

class NvidiaSmiSource : public TelemetrySource {
 public:
  struct Options {
    // Path or name on PATH. Empty: $SCALELAB_NVIDIA_SMI if set, else "nvidia-smi".
    std::string path;
    std::chrono::milliseconds interval{200};
    bool cuda_visible_from_env = true;             // as NvmlSource::Options
    std::optional<std::string> cuda_visible_devices;
  };

  explicit NvidiaSmiSource(Options options);
  ~NvidiaSmiSource() override;
  NvidiaSmiSource(const NvidiaSmiSource&) = delete;
  NvidiaSmiSource& operator=(const NvidiaSmiSource&) = delete;

  std::string name() const override { return "nvidia-smi"; }
  // Probes nvidia-smi (index and uuid of every GPU) and maps its GPUs to CUDA ordinals.
  std::string open() override;
  // Starts the streaming nvidia-smi and the reader thread that appends its lines to `out`.
  void begin(TelemetryClock::time_point t0, TimeSeries& out) override;
  void sample(double, TimeSeries&) override {}  // the stream appends on its own
  void close() override;

  // CPU seconds the streaming nvidia-smi process used (measured at close(); 0 before).
  double child_cpu_s() const { return child_cpu_s_; }
  // The streaming nvidia-smi's pid while it runs (-1 otherwise).
  pid_t child_pid() const { return pid_.load(); }
  // Data lines parsed so far.
  std::size_t lines_parsed() const { return lines_parsed_.load(); }
  // True once the stream has ended (nvidia-smi exited), whether or not close() was called.
  bool stream_ended() const { return ended_.load(); }

 private:
  void reader(TelemetryClock::time_point t0, TimeSeries* out);

  Options options_;
  std::string exe_;
  std::map<unsigned, std::string> device_by_index_;  // nvidia-smi index -> "cuda:<ordinal>"
  Subprocess child_;            // the streaming nvidia-smi
  std::atomic<pid_t> pid_{-1};  // child_'s pid while it runs, for child_pid() from other threads
  int wake_fd_ = -1;  // eventfd: close() wakes the reader out of poll()
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ended_{false};
  std::atomic<std::size_t> lines_parsed_{0};
  double child_cpu_s_ = 0;
};

}  // namespace scalelab
