#pragma once
// TelemetrySession: the one entry point for sampling a run (the train command, the lab's trial
// runner, the monitor command).
//
//   TelemetryOptions opt;                       // defaults: 200 ms, every source, this process
//   opt.engine = {{"cuda:0", [&] { return alloc.stats(); }}};
//   TelemetrySession telemetry(opt);
//   telemetry.start();                          // first reading now, then every interval
//   ... the run ...
//   telemetry.stop();                           // final reading; joins the sampler thread
//   record["telemetry"] = telemetry.summary(tokens);
//   telemetry.write_csv("run.csv");
//
// A source that cannot work here is reported once ("nvml unavailable: <reason>", one stderr line
// and a note in the summary) and the others carry on. Nothing in a session throws once it has
// started, except write_csv() for an unwritable path; the destructor stops a running session, so
// a run that fails (throws) still stops its sampler cleanly.
#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "telemetry/engine_source.h"
#include "telemetry/nvml.h"
#include "telemetry/sampler.h"
#include "telemetry/source.h"
#include "telemetry/time_series.h"

namespace scalelab {

class NvidiaSmiSource;
class ProcessSource;
class HostSource;

struct TelemetryOptions {
  std::chrono::milliseconds interval{200};  // --telemetry-interval

  // Which sources to use. Engine: on when `engine` has probes.
  bool nvml = true;
  bool nvidia_smi = true;
  bool process = true;
  bool host = true;

  // The process tree to follow: 0 = this process. For an external command, the child's pid.
  pid_t root_pid = 0;
  bool follow_children = true;

  // The engine's allocator(s), by device name ("cuda:0" lines up with NVML's "cuda:0").
  std::vector<EngineProbe> engine;

  // Overrides (tests, unusual installs). Empty: $SCALELAB_NVML_LIBRARY / "libnvidia-ml.so.1" and
  // $SCALELAB_NVIDIA_SMI / "nvidia-smi" on PATH.
  std::string nvml_library;
  std::string nvidia_smi_path;

  // CUDA_VISIBLE_DEVICES of the observed process: this process's by default; for an external
  // command started with another value, set cuda_visible_from_env = false and give it (nullopt =
  // unset = every GPU).
  bool cuda_visible_from_env = true;
  std::optional<std::string> cuda_visible_devices;

  // Where /proc and /sys are (tests point these at fake trees).
  std::string proc_root = "/proc";
  std::string sys_root = "/sys";

  // One line on stderr per unavailable source ("<prefix>: nvml unavailable: ...").
  bool report_unavailable = true;
  std::string report_prefix = "scalelab telemetry";
};

class TelemetrySession {
 public:
  explicit TelemetrySession(TelemetryOptions options = {});
  ~TelemetrySession();
  TelemetrySession(const TelemetrySession&) = delete;
  TelemetrySession& operator=(const TelemetrySession&) = delete;

  // Opens the sources (if sample_now() has not) and starts the sampler thread, which reads every
  // source at once and then every interval. Throws InvalidInput for a non-positive interval and
  // RuntimeError when called twice.
  void start();
  // Takes a final reading, stops and joins the sampler thread, closes the sources. Idempotent.
  void stop();
  // Without the thread: opens the sources on first use, then takes one reading now. For
  // `scalelab monitor` and for tests that need an exact number of readings.
  void sample_now();
  bool running() const;

  // Summary of everything sampled so far (see docs/telemetry.md): per device and for the
  // process, avg/max per metric, energy, J per token (when `tokens` is given), average power,
  // agreement between sources, plus the sources' status and the notes.
  nlohmann::json summary(std::optional<double> tokens = std::nullopt) const;
  // The time series as CSV (one row per sample per device, with a source column).
  void write_csv(const std::string& path) const;
  // All readings in long format (t_s, source, device, metric, value), for the results store.
  std::vector<Sample> samples() const;
  const TimeSeries& series() const { return series_; }

  // "nvml" -> "ok" | "unavailable: <reason>" | "disabled", for every source.
  std::map<std::string, std::string> source_status() const;
  // Everything noted so far: unavailable sources, lost devices, an ended process...
  std::vector<std::string> notes() const;
  // The GPUs NVML sees, by CUDA ordinal (empty without NVML).
  std::vector<GpuInfo> gpus() const;
  // Readings taken (sampler ticks plus sample_now calls).
  std::size_t readings() const;
  // Seconds since the sources were opened.
  double elapsed_s() const;
  // CPU seconds the sampling used: the sampler thread (or sample_now callers) and the nvidia-smi
  // child process.
  double sampling_cpu_s() const;

 private:
  void open_sources();
  void tick();  // one reading of every open source
  void collect_notes();

  TelemetryOptions options_;
  TimeSeries series_;
  std::vector<std::unique_ptr<TelemetrySource>> sources_;  // opened, in reading order
  NvmlSource* nvml_ = nullptr;
  NvidiaSmiSource* smi_ = nullptr;
  ProcessSource* process_ = nullptr;
  std::unique_ptr<Sampler> sampler_;
  bool opened_ = false;
  bool closed_ = false;
  TelemetryClock::time_point t0_{};
  double start_unix_s_ = 0;
  std::map<std::string, std::string> status_;

  mutable std::mutex mu_;  // notes_, readings_, manual_cpu_s_
  std::vector<std::string> notes_;
  std::size_t readings_ = 0;
  double manual_cpu_s_ = 0;
  std::mutex tick_mu_;  // one reading at a time
};

}  // namespace scalelab
