#pragma once
// Telemetry for lab trials: every trial's process tree and all visible devices are sampled while
// it runs, and the samples and summary are stored with the trial (lab::TrialMonitor over a
// TelemetrySession).
#include <chrono>

#include "lab/executor.h"

namespace scalelab::lab {

// A factory for LabOptions::monitor: one TelemetrySession per trial, following the trial's
// process tree, sampling every `interval`; unavailable sources are noted in the summary only.
TrialMonitorFactory telemetry_monitor_factory(std::chrono::milliseconds interval);

}  // namespace scalelab::lab
