#include "analysis/telemetry.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "analysis/descriptive.h"
#include "lab/store.h"

namespace scalelab::analysis {
namespace {

struct Series {
  std::vector<double> t, v;
};

// The values of the steady window, in time order.
std::vector<double> steady(const Series& s) {
  std::vector<std::size_t> idx(s.t.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return s.t[a] < s.t[b]; });
  double t0 = s.t[idx.front()], t1 = s.t[idx.back()];
  double cut = t0 + 0.1 * (t1 - t0);
  std::vector<double> out;
  for (auto i : idx)
    if (s.t.size() < 10 || s.t[i] >= cut) out.push_back(s.v[i]);
  return out;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

}  // namespace

Json telemetry_section(const lab::ResultsStore& store, const std::string& sweep_name, lab::Table& imb, int max_points) {
  auto sweep = store.find_sweep(sweep_name);
  Json trials = Json::array();
  imb.columns = {{"trial", "trial", lab::CellFormat::kInt}, {"config", "configuration"}, {"device", "device"},
                 {"metric", "metric"}, {"mean_util_pct", "mean util %", lab::CellFormat::kFixed1},
                 {"idle_fraction", "idle share", lab::CellFormat::kFixed3}, {"ratio_to_median", "/ median", lab::CellFormat::kFixed3},
                 {"idle", "idle"}, {"straggler", "straggler"}};
  if (!sweep) return {{"trials", trials}};
  auto samples = store.telemetry_samples(0, sweep->sweep_id);
  std::map<std::int64_t, std::map<std::tuple<std::string, std::string, std::string>, Series>> by;
  for (const auto& s : samples) {
    auto& ser = by[s.trial_id][{s.source, s.device, s.metric}];
    ser.t.push_back(s.t_s);
    ser.v.push_back(s.value);
  }
  int without = 0;
  Json flagged = Json::array();
  // Trial labels name the parameters that vary over the sweep.
  std::map<std::string, std::set<std::string>> seen;
  for (const auto& t : store.trials(sweep->sweep_id))
    for (const auto& [k, v] : t.params()) seen[k].insert(v.dump());
  std::vector<std::string> varying;
  for (const auto& [k, vals] : seen)
    if (vals.size() > 1) varying.push_back(k);
  for (const auto& t : store.trials(sweep->sweep_id)) {
    if (t.status != lab::TrialStatus::kOk) continue;
    auto it = by.find(t.trial_id);
    if (it == by.end()) { ++without; continue; }
    Json header{{"trial_id", t.trial_id}, {"repeat", t.repeat}, {"config", lab::params_label(t.params(), varying)}, {"params", t.config.value("params", Json::object())}};
    Json outcomes = Json::object();
    for (const char* k : {"tokens_per_s_per_device", "tokens_per_s", "step_time_s", "max_reserved_gib", "val_loss", "final_loss", "mfu"})
      if (t.metrics.contains(k) && t.metrics[k].is_number()) outcomes[k] = t.metrics[k];
    header["outcomes"] = outcomes;
    Json series = Json::array();
    for (const auto& [key, ser] : it->second) {
      auto st = steady(ser);
      std::vector<double> sorted = st;
      std::sort(sorted.begin(), sorted.end());
      const std::size_t stride = std::max<std::size_t>(1, (ser.t.size() + static_cast<std::size_t>(max_points) - 1) / static_cast<std::size_t>(max_points));
      Json tt = Json::array(), vv = Json::array();
      for (std::size_t i = 0; i < ser.t.size(); i += stride) { tt.push_back(ser.t[i]); vv.push_back(ser.v[i]); }
      series.push_back({{"source", std::get<0>(key)}, {"device", std::get<1>(key)}, {"metric", std::get<2>(key)},
                        {"avg", mean(st)}, {"max", sorted.back()}, {"p95", quantile_sorted(sorted, 0.95)}, {"samples", ser.t.size()},
                        {"t", tt}, {"v", vv}});
    }
    header["series"] = series;
    // Imbalance over the GPUs' utilization.
    Json devices = Json::array();
    for (const char* src : {"nvml", "nvidia-smi"}) {
      std::vector<std::pair<std::string, std::vector<double>>> util;
      for (const auto& [key, ser] : it->second)
        if (std::get<0>(key) == src && std::get<2>(key) == "gpu_util_pct") util.push_back({std::get<1>(key), steady(ser)});
      if (util.empty()) continue;
      std::vector<double> means;
      for (const auto& [dev, v] : util) means.push_back(mean(v));
      std::vector<double> sorted = means;
      std::sort(sorted.begin(), sorted.end());
      const double med = quantile_sorted(sorted, 0.5);
      for (std::size_t k = 0; k < util.size(); ++k) {
        double idle = 0;
        for (double x : util[k].second) idle += x < 5.0;
        idle /= static_cast<double>(util[k].second.size());
        const bool is_idle = idle >= 0.25;
        const bool straggler = util.size() >= 2 && means[k] < 0.8 * med;
        Json row{{"trial", t.trial_id}, {"config", header["config"]}, {"device", util[k].first}, {"metric", std::string(src) + ".gpu_util_pct"},
                 {"mean_util_pct", means[k]}, {"idle_fraction", idle}, {"ratio_to_median", med > 0 ? Json(means[k] / med) : Json()},
                 {"idle", is_idle}, {"straggler", straggler}};
        devices.push_back(row);
        imb.rows.push_back(row);
        if (is_idle || straggler) flagged.push_back(row);
      }
      header["imbalance"] = {{"metric", std::string(src) + ".gpu_util_pct"}, {"max_over_median", med > 0 ? Json(sorted.back() / med) : Json()}, {"devices", devices}};
      break;
    }
    trials.push_back(header);
  }
  return {{"trials", trials}, {"trials_without_samples", without}, {"flagged", flagged}};
}

void add_telemetry(Analysis& a, const lab::ResultsStore& store, const std::string& sweep) {
  lab::Table imb;
  a.json["telemetry"] = telemetry_section(store, sweep, imb);
  a.tables.push_back({"imbalance", imb});
  const Json& fl = a.json["telemetry"]["flagged"];
  if (!fl.empty()) {
    std::ostringstream md;
    md << "\n## GPU imbalance (" << fl.size() << " flagged device(s); imbalance.csv has every trial x device)\n\n";
    lab::Table t = imb;
    t.rows.clear();
    for (const auto& r : fl) t.rows.push_back(r);
    md << lab::render_markdown(t);
    a.markdown += md.str();
  }
}

}  // namespace scalelab::analysis
