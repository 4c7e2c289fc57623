#pragma once
// What a session's series amount to: per device and for the process, the average and maximum of
// every metric, energy (from an energy counter where there is one, else integrated power),
// average power, energy per token; and how well the sources agree where they measure the same
// thing (Pearson r and mean difference over samples aligned in time).
//
// Everything here works on series alone, so the lab can recompute it from stored samples.
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "telemetry/time_series.h"

namespace scalelab {

// Pearson's correlation coefficient; nullopt with fewer than 3 pairs or a constant side.
std::optional<double> pearson_r(const std::vector<double>& x, const std::vector<double>& y);

// Pairs every point of `a` with the point of `b` nearest in time, when within `tolerance_s`.
// Each point of `b` is used at most once (the nearest claimant wins), so a fast series is not
// matched many times to one slow reading. Returns (a value, b value) in a's time order.
std::vector<std::pair<double, double>> align_nearest(const SeriesPoints& a, const SeriesPoints& b,
                                                     double tolerance_s);

// Integral of a series over time by the trapezoid rule (e.g. power_w -> J).
double integrate_trapezoid(const SeriesPoints& p);

// One comparison of two sources on one device.
struct AgreementRow {
  std::string device;
  std::string quantity;  // "mem_used_bytes", "power_w", "gpu_util_pct", ...
  std::string source_a, metric_a;
  std::string source_b, metric_b;
  std::size_t n = 0;                // aligned pairs
  std::optional<double> pearson_r;  // null with < 3 pairs or a constant side
  double mean_a = 0, mean_b = 0;
  double mean_diff = 0;      // mean of (b - a)
  double mean_abs_diff = 0;  // mean of |b - a|
};

// The comparable pairs: memory used (NVML, nvidia-smi, engine reserved bytes), power,
// GPU and memory utilization and temperature (NVML vs nvidia-smi), for every device that has
// both series. Rows with no aligned pair are left out.
std::vector<AgreementRow> compute_agreement(const std::map<SeriesKey, SeriesPoints>& series,
                                            double tolerance_s);
nlohmann::json agreement_to_json(const std::vector<AgreementRow>& rows);

struct SummaryOptions {
  std::optional<double> tokens;   // tokens processed during the span, for J per token
  double align_tolerance_s = 0.1; // for the agreement (half the sampling interval is right)
};

// The summary object (see docs/telemetry.md for its fields).
nlohmann::json summarize(const std::map<SeriesKey, SeriesPoints>& series, const SummaryOptions& opt);

}  // namespace scalelab
