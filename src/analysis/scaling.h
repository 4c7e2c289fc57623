#pragma once
// Scaling metrics of a data-parallel study: the same configuration measured at 1, 2, 4, ...
// devices (per-device micro-batch fixed, so the global batch grows: weak scaling), and the tables
// of the reference practice.
//
// For n devices with total throughput T(n) tokens/s, against the baseline b (1 device, or the
// smallest count measured):
//   per-device throughput   T(n) / n
//   speedup                 S = T(n) / T(b)
//   parallel efficiency     S / (n / b), in %
//   cost efficiency         (T(n) / n) / (T(b) / b): throughput per device-hour relative to the
//                           baseline (equal to the efficiency as a fraction when the price per
//                           device-hour is the same at every count)
//   cost per 1M tokens      price_per_device_hour * n / (3600 * T(n)) * 1e6
//   energy per token        J/token, measured (telemetry) or average power / T(n)
//   Karp–Flatt serial fraction  e = (1/S - 1/p) / (1 - 1/p), p = n / b > 1: the fraction of the
//                           work that behaves as if it were serial; constant e means a fixed
//                           serial part, growing e means overhead that grows with n (communication)
// Recommendations for a token budget B: the count with the shortest time to solution B / T(n),
// the lowest cost (price * n * time; device-hours when no price is given: the same ranking), and
// the lowest energy (only among counts with an energy figure). Ties go to fewer devices.
#include <optional>
#include <string>
#include <vector>

namespace scalelab {

struct ScalingPoint {
  int devices = 1;
  double tokens_per_s = 0;                   // total, all devices
  std::optional<double> energy_j_per_token;  // measured, all devices
  std::optional<double> power_w;             // average total power of all devices
};

struct ScalingOptions {
  std::optional<double> price_per_device_hour;  // --price-per-device-hour (any currency)
  double token_budget = 1e9;                    // tokens to train, for the recommendations
};

struct ScalingRow {
  int devices = 1;
  int samples = 1;  // measurements averaged into this row
  double tokens_per_s = 0;
  double tokens_per_s_per_device = 0;
  double speedup = 1;
  double efficiency_pct = 100;
  double cost_efficiency = 1;
  std::optional<double> cost_per_million_tokens;
  std::optional<double> energy_j_per_token;
  std::optional<double> karp_flatt;  // none at the baseline
  double time_to_budget_s = 0;
  double device_hours_to_budget = 0;
  std::optional<double> cost_to_budget;
  std::optional<double> energy_to_budget_j;
};

enum class ScalingPurpose { kTime, kCost, kEnergy };
const char* scaling_purpose_name(ScalingPurpose p);  // "shortest time", "lowest cost", "lowest energy"

struct ScalingRecommendation {
  ScalingPurpose purpose;
  std::optional<int> devices;  // none when no point has the data (energy without telemetry)
  std::string reason;          // one sentence with the figures
};

struct ScalingReport {
  int baseline_devices = 1;
  std::vector<ScalingRow> rows;  // by device count
  std::vector<ScalingRecommendation> recommendations;  // time, cost, energy
};

// Points at the same device count are averaged (repeats). Throws InvalidInput for no points, a
// device count below 1, or a throughput that is not positive and finite.
ScalingReport analyze_scaling(const std::vector<ScalingPoint>& points, const ScalingOptions& options = {});

// The table and the recommendations, in Markdown.
std::string render_scaling_markdown(const ScalingReport& report, const ScalingOptions& options = {});

}  // namespace scalelab
