#include "analysis/scaling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>

#include "core/error.h"

namespace scalelab {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// 156250 s -> "43.4 h"; 90 s -> "1.5 min".
std::string human_time(double s) {
  if (s >= 2 * 86400) return fmt("%.1f days", s / 86400);
  if (s >= 3600) return fmt("%.1f h", s / 3600);
  if (s >= 60) return fmt("%.1f min", s / 60);
  return fmt("%.1f s", s);
}

std::string human_count(double v) {
  if (v >= 1e12) return fmt("%.3g T", v / 1e12);
  if (v >= 1e9) return fmt("%.3g B", v / 1e9);
  if (v >= 1e6) return fmt("%.3g M", v / 1e6);
  return fmt("%.0f", v);
}

std::string human_energy(double j) {
  if (j >= 3.6e6) return fmt("%.3g kWh", j / 3.6e6);
  return fmt("%.3g J", j);
}

// Index of the row with the smallest key among those that have one (first = fewest devices wins
// ties, rows being sorted by device count); -1 if none.
int argmin(const std::vector<ScalingRow>& rows, const std::function<std::optional<double>(const ScalingRow&)>& key) {
  int best = -1;
  double best_v = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::optional<double> v = key(rows[i]);
    if (!v) continue;
    // Relative tolerance so that equal figures computed differently still tie.
    if (best < 0 || *v < best_v * (1 - 1e-12)) {
      best = static_cast<int>(i);
      best_v = *v;
    }
  }
  return best;
}

}  // namespace

const char* scaling_purpose_name(ScalingPurpose p) {
  switch (p) {
    case ScalingPurpose::kTime: return "shortest time";
    case ScalingPurpose::kCost: return "lowest cost";
    case ScalingPurpose::kEnergy: return "lowest energy";
  }
  return "?";
}

ScalingReport analyze_scaling(const std::vector<ScalingPoint>& points, const ScalingOptions& options) {
  SCALELAB_CHECK_INPUT(!points.empty(), "[scaling] no results to analyze — run the study at one or more device counts");
  SCALELAB_CHECK_INPUT(options.token_budget > 0 && std::isfinite(options.token_budget),
                       "[scaling] the token budget must be positive (got " + std::to_string(options.token_budget) + ")");
  SCALELAB_CHECK_INPUT(!options.price_per_device_hour ||
                           (*options.price_per_device_hour >= 0 && std::isfinite(*options.price_per_device_hour)),
                       "[scaling] --price-per-device-hour must be a non-negative number");
  // Average repeats per device count.
  struct Acc {
    int n = 0;
    double tps = 0, energy = 0, power = 0;
    int n_energy = 0, n_power = 0;
  };
  std::map<int, Acc> by_devices;
  for (const ScalingPoint& p : points) {
    SCALELAB_CHECK_INPUT(p.devices >= 1, "[scaling] a result has " + std::to_string(p.devices) +
                                             " devices — device counts start at 1");
    SCALELAB_CHECK_INPUT(p.tokens_per_s > 0 && std::isfinite(p.tokens_per_s),
                         "[scaling] the result at " + std::to_string(p.devices) + " devices has throughput " +
                             std::to_string(p.tokens_per_s) + " tokens/s — only successful runs can be analyzed");
    Acc& a = by_devices[p.devices];
    ++a.n;
    a.tps += p.tokens_per_s;
    if (p.energy_j_per_token) {
      a.energy += *p.energy_j_per_token;
      ++a.n_energy;
    }
    if (p.power_w) {
      a.power += *p.power_w;
      ++a.n_power;
    }
  }
  ScalingReport rep;
  rep.baseline_devices = by_devices.begin()->first;
  const double base_tps = by_devices.begin()->second.tps / by_devices.begin()->second.n;
  const double b = rep.baseline_devices;
  for (const auto& [n, a] : by_devices) {
    ScalingRow r;
    r.devices = n;
    r.samples = a.n;
    r.tokens_per_s = a.tps / a.n;
    r.tokens_per_s_per_device = r.tokens_per_s / n;
    r.speedup = r.tokens_per_s / base_tps;
    const double p = n / b;
    r.efficiency_pct = 100.0 * r.speedup / p;
    r.cost_efficiency = r.tokens_per_s_per_device / (base_tps / b);
    if (options.price_per_device_hour)
      r.cost_per_million_tokens = *options.price_per_device_hour * n / (3600.0 * r.tokens_per_s) * 1e6;
    if (a.n_energy) r.energy_j_per_token = a.energy / a.n_energy;
    else if (a.n_power) r.energy_j_per_token = (a.power / a.n_power) / r.tokens_per_s;
    if (p > 1) r.karp_flatt = (1.0 / r.speedup - 1.0 / p) / (1.0 - 1.0 / p);
    r.time_to_budget_s = options.token_budget / r.tokens_per_s;
    r.device_hours_to_budget = n * r.time_to_budget_s / 3600.0;
    if (options.price_per_device_hour) r.cost_to_budget = *options.price_per_device_hour * r.device_hours_to_budget;
    if (r.energy_j_per_token) r.energy_to_budget_j = *r.energy_j_per_token * options.token_budget;
    rep.rows.push_back(r);
  }

  const std::string budget = human_count(options.token_budget) + " tokens";
  auto describe = [&](const ScalingRow& r) {
    return std::to_string(r.devices) + (r.devices == 1 ? " device" : " devices") + ": " +
           human_time(r.time_to_budget_s) + " for " + budget + " (" + fmt("%.2f", r.speedup) + "x, " +
           fmt("%.1f", r.efficiency_pct) + "% efficiency, " + fmt("%.1f", r.device_hours_to_budget) + " device-hours";
  };
  {
    const int i = argmin(rep.rows, [](const ScalingRow& r) { return std::optional<double>(r.time_to_budget_s); });
    const ScalingRow& r = rep.rows[static_cast<std::size_t>(i)];
    rep.recommendations.push_back({ScalingPurpose::kTime, r.devices, describe(r) + ")"});
  }
  {
    const int i = argmin(rep.rows, [](const ScalingRow& r) { return std::optional<double>(r.device_hours_to_budget); });
    const ScalingRow& r = rep.rows[static_cast<std::size_t>(i)];
    std::string why = describe(r);
    if (r.cost_to_budget) why += ", cost " + fmt("%.2f", *r.cost_to_budget);
    rep.recommendations.push_back({ScalingPurpose::kCost, r.devices, why + ")"});
  }
  {
    const int i = argmin(rep.rows, [](const ScalingRow& r) { return r.energy_to_budget_j; });
    if (i < 0) {
      rep.recommendations.push_back({ScalingPurpose::kEnergy, std::nullopt,
                                     "no energy figures (run with telemetry to measure power)"});
    } else {
      const ScalingRow& r = rep.rows[static_cast<std::size_t>(i)];
      rep.recommendations.push_back({ScalingPurpose::kEnergy, r.devices,
                                     describe(r) + ", " + human_energy(*r.energy_to_budget_j) + ")"});
    }
  }
  return rep;
}

std::string render_scaling_markdown(const ScalingReport& report, const ScalingOptions& options) {
  const bool cost = options.price_per_device_hour.has_value();
  const bool energy = std::any_of(report.rows.begin(), report.rows.end(),
                                  [](const ScalingRow& r) { return r.energy_j_per_token.has_value(); });
  std::string md = "| devices | tokens/s per device | total tokens/s | speedup | efficiency % | cost efficiency |";
  std::string rule = "|---:|---:|---:|---:|---:|---:|";
  if (cost) {
    md += " cost per 1M tokens |";
    rule += "---:|";
  }
  if (energy) {
    md += " J/token |";
    rule += "---:|";
  }
  md += " Karp–Flatt e |\n" + rule + "---:|\n";
  for (const ScalingRow& r : report.rows) {
    md += "| " + std::to_string(r.devices) + " | " + fmt("%.1f", r.tokens_per_s_per_device) + " | " +
          fmt("%.1f", r.tokens_per_s) + " | " + fmt("%.2f", r.speedup) + " | " + fmt("%.1f", r.efficiency_pct) +
          " | " + fmt("%.3f", r.cost_efficiency) + " |";
    // (Appended piece by piece: GCC 12 warns falsely on `" " + std::string` here.)
    if (cost) md.append(" ").append(fmt("%.4f", *r.cost_per_million_tokens)).append(" |");
    if (energy) md.append(" ").append(r.energy_j_per_token ? fmt("%.4g", *r.energy_j_per_token) : "–").append(" |");
    md.append(" ").append(r.karp_flatt ? fmt("%.4f", *r.karp_flatt) : "–").append(" |\n");
  }
  if (report.baseline_devices != 1)
    md += "\nBaseline: " + std::to_string(report.baseline_devices) +
          " devices (no 1-device result): speedup and efficiency are relative to it.\n";
  md += "\nRecommendation for " + human_count(options.token_budget) + " tokens:\n";
  for (const ScalingRecommendation& r : report.recommendations)
    md += std::string("- ") + scaling_purpose_name(r.purpose) + ": " + r.reason + "\n";
  return md;
}

}  // namespace scalelab
