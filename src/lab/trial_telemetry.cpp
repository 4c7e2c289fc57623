#include "lab/trial_telemetry.h"

#include <memory>
#include <optional>

#include "telemetry/session.h"

namespace scalelab::lab {

namespace {

class TelemetryTrialMonitor final : public TrialMonitor {
 public:
  explicit TelemetryTrialMonitor(std::chrono::milliseconds interval) : interval_(interval) {}

  void start(int pid) override {
    TelemetryOptions o;
    o.interval = interval_;
    o.root_pid = pid;
    // The trial runs with the runner's environment, so its CUDA_VISIBLE_DEVICES is ours.
    o.report_unavailable = false;  // noted in the summary, not on the runner's terminal
    session_.emplace(o);
    session_->start();
  }

  void stop(std::vector<TelemetrySample>& samples, Json& summary) override {
    if (!session_) return;
    session_->stop();
    for (const Sample& s : session_->samples()) samples.push_back({0, s.t_s, s.source, s.device, s.metric, s.value});
    summary = session_->summary();
    session_.reset();
  }

 private:
  std::chrono::milliseconds interval_;
  std::optional<TelemetrySession> session_;
};

}  // namespace

TrialMonitorFactory telemetry_monitor_factory(std::chrono::milliseconds interval) {
  return [interval] { return std::make_unique<TelemetryTrialMonitor>(interval); };
}

}  // namespace scalelab::lab
