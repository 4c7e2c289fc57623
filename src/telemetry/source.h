#pragma once
// The interface every telemetry source implements (NVML, nvidia-smi, process tree, host, engine).
//
// A source is opened once, begun (once all are open), sampled at every tick of the sampler, and
// closed. A source that cannot work here (no GPU, no driver, no nvidia-smi) says why from open()
// and is left out; a source that fails later (a device lost, a followed process ended) records
// a note once and carries on.
// sample() never throws: telemetry never fails the run it observes.
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "telemetry/time_series.h"

namespace scalelab {

using TelemetryClock = std::chrono::steady_clock;

class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;

  // The source column value: "nvml", "nvidia-smi", "process", "host", "engine".
  virtual std::string name() const = 0;

  // Prepares the source (loads libraries, probes tools, takes counter baselines). Returns "" when
  // the source works, otherwise why it is unavailable ("libnvidia-ml.so.1 not found", ...).
  virtual std::string open() = 0;

  // Called once every source is open, with the session's time origin (t_s = 0) and its store:
  // asynchronous sources (the nvidia-smi stream) start here and append from their own thread.
  virtual void begin(TelemetryClock::time_point t0, TimeSeries& out) {}

  // Takes one reading of everything the source measures, stamped `t_s`. Never throws.
  virtual void sample(double t_s, TimeSeries& out) = 0;

  // Releases what open() and begin() acquired (threads, child processes, libraries). Idempotent.
  virtual void close() {}

  // Notes recorded since the last call, for the session's notes list. Sources record each
  // condition once (a lost device, an ended process), not at every tick.
  std::vector<std::string> take_notes() {
    std::lock_guard<std::mutex> lock(notes_mu_);
    return std::move(notes_);
  }

 protected:
  // Records a note; the text starts with the source name ("nvml: ..."). Thread-safe.
  void note(const std::string& text) {
    std::lock_guard<std::mutex> lock(notes_mu_);
    notes_.push_back(text);
  }

 private:
  std::mutex notes_mu_;
  std::vector<std::string> notes_;
};

}  // namespace scalelab
