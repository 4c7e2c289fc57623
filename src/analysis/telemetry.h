#pragma once
// Telemetry per trial x device (#1): for every successful trial of a sweep, its header (the
// parameters and main outcomes), each series (source, device, metric) with its avg / max / p95 over
// the steady window (docs/analysis.md: t >= t0 + 0.1 (t1 - t0), all samples below 10), the points
// for the report (at most `max_points` per series, every k-th), and the imbalance table:
//   per device: mean utilization over the steady window (NVML's gpu_util_pct, else nvidia-smi's),
//   idle fraction = share of its steady samples below 5 %, ratio = mean / median of the devices'
//   means; flags: idle (idle fraction >= 25 %), straggler (>= 2 devices and mean < 0.8 median);
//   per trial: max / median of the device means.
#include <string>

#include "analysis/analyze.h"

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

// The "telemetry" section of analysis.json, and the imbalance table (one row per trial x device).
// Trials without samples are counted, not listed.
Json telemetry_section(const lab::ResultsStore& store, const std::string& sweep, lab::Table& imbalance, int max_points = 240);

// Adds the section and its table to an analysis (a sweep's; a CSV has no telemetry).
void add_telemetry(Analysis& a, const lab::ResultsStore& store, const std::string& sweep);

}  // namespace scalelab::analysis
