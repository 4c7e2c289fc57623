#pragma once
// Agreement of telemetry sources (#7) that measure the same quantity on the same device:
//   nvml.mem_used_bytes vs nvidia-smi.mem_used_bytes and vs engine.mem_reserved_bytes,
//   nvml.power_w vs nvidia-smi.power_w, nvml.gpu_util_pct vs nvidia-smi.gpu_util_pct,
//   nvml.temperature_c vs nvidia-smi.temperature_c.
// Per sample: the points of a and b of one trial and device paired by time (telemetry's
// align_nearest, within 0.25 s, each b point used once), pooled over the sweep's trials and
// devices. Per trial: each trial x device's mean of a and of b. For both:
//   OLS of b on a (slope, intercept, r, R^2, scipy.stats.linregress);
//   Bland–Altman on d = b - a: bias = mean d, sd = sd(d, ddof 1), limits bias ± 1.96 sd;
//   Lin's CCC = 2 s_ab / (s_a^2 + s_b^2 + (mean a - mean b)^2) with population (ddof 0) moments.
#include <string>

#include "analysis/analyze.h"

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

struct AgreementStats {
  std::size_t n = 0;
  double slope, intercept, r, r2, bias, sd, lower, upper, ccc;
};
// NaN fields when n < 3 or a side is constant.
AgreementStats agreement_stats(const std::vector<double>& a, const std::vector<double>& b);

// The "agreement" section (pairs with at least one aligned point) and its table.
Json agreement_section(const lab::ResultsStore& store, const std::string& sweep, lab::Table& table, std::size_t max_points = 400);
void add_agreement(Analysis& a, const lab::ResultsStore& store, const std::string& sweep);

}  // namespace scalelab::analysis
