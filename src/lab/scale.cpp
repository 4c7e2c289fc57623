#include "lab/scale.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "core/error.h"
#include "lab/launchers.h"

namespace scalelab::lab {
namespace {

std::optional<double> number_at(const Json& j, const char* a, const char* b = nullptr) {
  if (!j.is_object() || !j.contains(a)) return std::nullopt;
  const Json& x = j[a];
  if (b == nullptr) return x.is_number() ? std::optional<double>(x.get<double>()) : std::nullopt;
  if (!x.is_object() || !x.contains(b) || !x[b].is_number()) return std::nullopt;
  return x[b].get<double>();
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

Json ScaleSpec::to_json() const {
  return {{"ranks", ranks},
          {"repeats", repeats},
          {"launcher", launcher},
          {"price_per_device_hour", price_per_device_hour ? Json(*price_per_device_hour) : Json()},
          {"token_budget", token_budget},
          {"params", Json(params)},
          {"threads_per_rank", threads_per_rank}};
}

ScaleSpec ScaleSpec::from_json(const Json& j) {
  ScaleSpec s;
  if (!j.is_object()) return s;
  if (j.contains("ranks") && j["ranks"].is_array())
    for (const auto& r : j["ranks"])
      if (r.is_number_integer()) s.ranks.push_back(r.get<int>());
  s.repeats = j.value("repeats", 1);
  s.launcher = j.value("launcher", std::string("mpirun"));
  if (j.contains("price_per_device_hour") && j["price_per_device_hour"].is_number())
    s.price_per_device_hour = j["price_per_device_hour"].get<double>();
  s.token_budget = j.value("token_budget", 1e9);
  if (j.contains("params") && j["params"].is_object())
    for (auto it = j["params"].begin(); it != j["params"].end(); ++it) s.params[it.key()] = it.value();
  s.threads_per_rank = j.value("threads_per_rank", 0);
  return s;
}

std::vector<int> parse_rank_list(const std::vector<int>& ranks) {
  SCALELAB_CHECK_INPUT(!ranks.empty(), "[scale] --ranks needs at least one rank count, e.g. --ranks 1,2,4");
  std::vector<int> out;
  for (int r : ranks) {
    SCALELAB_CHECK_INPUT(r >= 1, "[scale] --ranks: " + std::to_string(r) + " is not a rank count (1 or more)");
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
  }
  return out;
}

ParamMap scale_trial_params(const ScaleSpec& spec, int ranks) {
  ParamMap p = spec.params;
  p[kRanksParam] = ranks;
  p[kLauncherParam] = spec.launcher;
  if (spec.threads_per_rank > 0 && !p.count("threads")) p["threads"] = spec.threads_per_rank;
  return p;
}

int scale_threads_per_rank(const ScaleSpec& spec, int cores) {
  if (auto it = spec.params.find("threads"); it != spec.params.end())
    return it->second.is_number_integer() ? it->second.get<int>() : 0;
  if (spec.launcher != "mpirun" || spec.ranks.empty()) return 0;
  const int max_ranks = *std::max_element(spec.ranks.begin(), spec.ranks.end());
  return std::max(1, std::max(1, cores) / max_ranks);
}

std::string slurm_time_limit(double seconds) {
  const long minutes = static_cast<long>(std::ceil(seconds / 60.0)) + 1;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02ld:%02ld:00", minutes / 60, minutes % 60);
  return buf;
}

bool refused_by_engine(const TrialRow& row) {
  return row.status == TrialStatus::kError && row.exit_code && *row.exit_code == exit_code(ErrorKind::kInvalidInput);
}

ScaleVerdict scale_verdict(const ScaleSpec& spec, const std::vector<TrialRow>& rows) {
  ScaleVerdict v;
  std::set<int> ok;
  for (const auto& r : rows) {
    if (r.status == TrialStatus::kOk) ok.insert(trial_ranks(r.params()));
    v.refused = v.refused || refused_by_engine(r);
  }
  for (int n : spec.ranks)
    if (!ok.count(n)) v.missing_ranks.push_back(n);
  return v;
}

std::vector<TrialRow> run_scale(TrialExecutor& exec, const ScaleSpec& spec) {
  std::vector<TrialRow> rows;
  // Repeats outside, rank counts inside: a drift of the machine's load spreads over every count
  // instead of biasing the ones measured last.
  for (int rep = 0; rep < spec.repeats; ++rep) {
    for (int n : spec.ranks) {
      const ParamMap params = scale_trial_params(spec, n);
      const std::string label = std::to_string(n) + (n == 1 ? " rank" : " ranks") +
                                (spec.repeats > 1 ? " (repeat " + std::to_string(rep) + ")" : "");
      TrialExecutor::Result r = exec.run(params, rep, "scale: " + std::to_string(n) + " ranks", label);
      rows.push_back(r.row);
      // The engine refused the configuration (exit 2): every other rank count would too.
      if (refused_by_engine(r.row)) return rows;
    }
  }
  return rows;
}

Table scale_table(const std::vector<TrialRow>& trials, const ScaleSpec& spec) {
  const std::set<int> wanted(spec.ranks.begin(), spec.ranks.end());
  struct Group {
    std::vector<const TrialRow*> ok;
    std::vector<const TrialRow*> failed;
  };
  std::map<int, Group> groups;
  for (const TrialRow& t : trials) {
    const ParamMap p = t.params();
    auto it = p.find(kRanksParam);
    if (it == p.end() || !it->second.is_number_integer()) continue;
    const int n = it->second.get<int>();
    if (!wanted.count(n) || t.repeat >= spec.repeats) continue;
    (t.status == TrialStatus::kOk && t.metrics.contains("tokens_per_s") ? groups[n].ok : groups[n].failed).push_back(&t);
  }

  ScalingOptions options;
  options.price_per_device_hour = spec.price_per_device_hour;
  options.token_budget = spec.token_budget;
  std::vector<ScalingPoint> points;
  for (const auto& [n, g] : groups) {
    for (const TrialRow* t : g.ok) {
      ScalingPoint p;
      p.devices = n;
      p.tokens_per_s = t->metrics["tokens_per_s"].get<double>();
      p.energy_j_per_token = number_at(t->record, "telemetry", "j_per_token");
      p.power_w = number_at(t->record, "telemetry", "avg_power_w");
      points.push_back(p);
    }
  }

  Table table;
  const bool cost = spec.price_per_device_hour.has_value();
  table.columns = {{"ranks", "devices", CellFormat::kInt},
                   {"runs", "runs", CellFormat::kInt},
                   {"status", "status"},
                   {"tokens_per_s_per_device", "tokens/s per device", CellFormat::kFixed1},
                   {"tokens_per_s", "total tokens/s", CellFormat::kFixed1},
                   {"speedup", "speedup", CellFormat::kRatio},
                   {"efficiency_pct", "efficiency %", CellFormat::kFixed1},
                   {"cost_efficiency", "cost efficiency", CellFormat::kFixed3}};
  if (cost) table.columns.push_back({"cost_per_million_tokens", "cost per 1M tokens", CellFormat::kSig4});
  ScalingReport report;
  if (!points.empty()) report = analyze_scaling(points, options);
  const bool energy = std::any_of(report.rows.begin(), report.rows.end(),
                                  [](const ScalingRow& r) { return r.energy_j_per_token.has_value(); });
  if (energy) table.columns.push_back({"j_per_token", "J/token", CellFormat::kSig4});
  table.columns.push_back({"karp_flatt", "Karp–Flatt e", CellFormat::kFixed4});
  table.columns.push_back({"comm_time_s", "comm s/step", CellFormat::kFixed4});
  table.columns.push_back({"comm_hidden_pct", "comm hidden %", CellFormat::kFixed1});
  table.columns.push_back({"step_time_s", "step s", CellFormat::kFixed3});
  table.columns.push_back({"reason", "reason"});

  std::map<int, const ScalingRow*> analyzed;
  for (const ScalingRow& r : report.rows) analyzed[r.devices] = &r;
  for (const auto& [n, g] : groups) {
    Json row{{"ranks", n}, {"runs", static_cast<int>(g.ok.size() + g.failed.size())}};
    Json ids = Json::array();
    for (const TrialRow* t : g.ok) ids.push_back(t->trial_id);
    for (const TrialRow* t : g.failed) ids.push_back(t->trial_id);
    row["trial_ids"] = ids;
    if (g.failed.empty()) {
      row["status"] = status_name(TrialStatus::kOk);
    } else {
      std::map<std::string, int> counts;
      for (const TrialRow* t : g.failed) ++counts[status_name(t->status)];
      std::string s = g.ok.empty() ? "" : "ok " + std::to_string(g.ok.size());
      for (const auto& [k, c] : counts) append_item(s, k + " " + std::to_string(c), ", ");
      row["status"] = g.ok.empty() && counts.size() == 1 && g.failed.size() == 1 ? std::string(status_name(g.failed.front()->status)) : s;
      row["reason"] = g.failed.front()->reason;
    }
    if (auto it = analyzed.find(n); it != analyzed.end()) {
      const ScalingRow& r = *it->second;
      row["tokens_per_s_per_device"] = r.tokens_per_s_per_device;
      row["tokens_per_s"] = r.tokens_per_s;
      row["speedup"] = r.speedup;
      row["efficiency_pct"] = r.efficiency_pct;
      row["cost_efficiency"] = r.cost_efficiency;
      if (r.cost_per_million_tokens) row["cost_per_million_tokens"] = *r.cost_per_million_tokens;
      if (r.energy_j_per_token) row["j_per_token"] = *r.energy_j_per_token;
      row["karp_flatt"] = r.karp_flatt ? Json(*r.karp_flatt) : Json();
      row["time_to_budget_s"] = r.time_to_budget_s;
      row["device_hours_to_budget"] = r.device_hours_to_budget;
      std::vector<double> comm, hidden, step;
      for (const TrialRow* t : g.ok) {
        if (auto c = number_at(t->record, "comm_time_s")) comm.push_back(*c);
        if (auto h = number_at(t->record, "comm_hidden_fraction")) hidden.push_back(100.0 * *h);
        if (auto s = number_at(t->record, "step_time_s")) step.push_back(*s);
      }
      if (!comm.empty()) row["comm_time_s"] = mean(comm);
      if (!hidden.empty()) row["comm_hidden_pct"] = mean(hidden);
      if (!step.empty()) row["step_time_s"] = mean(step);
    }
    table.rows.push_back(std::move(row));
  }
  for (int n : spec.ranks)
    if (!groups.count(n)) table.notes.push_back(std::to_string(n) + " ranks: not run yet.");
  if (points.empty()) {
    table.notes.push_back("No successful trial: nothing to compare.");
    return table;
  }
  if (report.baseline_devices != 1)
    table.notes.push_back("Baseline: " + std::to_string(report.baseline_devices) +
                          " devices (no successful 1-device result): speedup and efficiency are relative to it.");
  table.notes.push_back("Per-device micro-batch fixed (weak scaling); a device is one rank" +
                        std::string(spec.threads_per_rank > 0 ? " of " + std::to_string(spec.threads_per_rank) +
                                                                    (spec.threads_per_rank == 1 ? " thread" : " threads")
                                                              : "") +
                        ". Karp–Flatt e = (1/speedup − 1/p)/(1 − 1/p).");
  char budget[64];
  std::snprintf(budget, sizeof budget, "%.4g", spec.token_budget);
  table.notes.push_back(std::string("Recommendation for a budget of ") + budget + " tokens:");
  for (const ScalingRecommendation& r : report.recommendations)
    table.notes.push_back(std::string("- ") + scaling_purpose_name(r.purpose) + ": " + r.reason);
  return table;
}

Table scale_sweep_table(const SweepRow& sweep, const ResultsStore& store) {
  SCALELAB_CHECK_INPUT(sweep.kind == kScaleKind, "[results] '" + sweep.name + "' is a " + sweep.kind +
                                                     ", not a scaling study — use --view summary or trials");
  return scale_table(store.trials(sweep.sweep_id), ScaleSpec::from_json(sweep.spec));
}

}  // namespace scalelab::lab
