#include "analysis/memory.h"

#include <algorithm>
#include <map>
#include <set>

#include "lab/store.h"
#include "lab/views.h"

namespace scalelab::analysis {

void add_memory(Analysis& a, const lab::ResultsStore& store, const std::string& sweep_name) {
  const auto sweep = store.find_sweep(sweep_name);
  if (!sweep) return;
  const auto presets = lab::preset_parameters(*sweep);
  if (!presets.empty()) a.json["presets"] = presets;
  // The sweep's configurations (an [oom_search]'s probes are not configurations of it).
  const std::vector<lab::TrialRow> trials = lab::member_trials(*sweep, store);
  lab::Table t = lab::memory_table(trials, {}, lab::parameter_order(*sweep));
  lab::fold_preset_columns(t, *sweep);
  // The parts: the table's plan_<part>_gib columns, in its order.
  std::vector<std::string> parts, label_keys;
  bool after_status = false;
  for (const auto& c : t.columns) {
    if (c.key.size() > 9 && c.key.rfind("plan_", 0) == 0 && c.key.compare(c.key.size() - 4, 4, "_gib") == 0)
      parts.push_back(c.key.substr(5, c.key.size() - 9));
    // The parameter columns sit between "status" and "trainable_params"; folded ones (a preset's
    // parameters) do not label.
    if (c.key == "trainable_params") after_status = false;
    if (after_status && !c.folded) label_keys.push_back(c.key);
    if (c.key == "status") after_status = true;
  }
  if (parts.empty()) return;
  // The analysis row of a configuration is "trial <its first finished trial>" (analysis/frame.h).
  std::map<std::string, std::int64_t> first_ok;
  for (const auto& r : trials)
    if (r.status == lab::TrialStatus::kOk && !first_ok.count(r.config_hash)) first_ok[r.config_hash] = r.trial_id;
  // One row per configuration: its first finished trial with a plan, else its first with one.
  std::vector<std::string> order;
  std::map<std::string, const Json*> pick;
  for (const auto& o : t.rows) {
    if (!o.contains("plan_total_bytes")) continue;
    const std::string h = o.value("config_hash", std::string());
    auto it = pick.find(h);
    if (it == pick.end()) {
      order.push_back(h);
      pick[h] = &o;
    } else if (it->second->value("status", std::string()) != "ok" && o.value("status", std::string()) == "ok") {
      it->second = &o;
    }
  }
  Json rows = Json::array();
  for (const auto& h : order) {
    const Json& o = *pick[h];
    std::string label;
    for (const auto& k : label_keys) {
      if (!o.contains(k) || o[k].is_null()) continue;
      label += (label.empty() ? "" : " ") + k + "=" + (o[k].is_string() ? o[k].get<std::string>() : o[k].dump());
    }
    const std::int64_t id = o["trial_id"].get<std::int64_t>();
    if (label.empty()) label = "trial " + std::to_string(id);
    Json pj = Json::object();
    for (const auto& p : parts) {
      auto it = o.find("plan_" + p + "_bytes");
      if (it != o.end() && it->is_number() && it->get<double>() > 0) pj[p] = *it;
    }
    auto fo = first_ok.find(h);
    rows.push_back({{"row", "trial " + std::to_string(fo != first_ok.end() ? fo->second : id)}, {"label", label}, {"trial_id", id},
                    {"status", o.value("status", std::string())}, {"parts", pj}, {"plan_total_bytes", o["plan_total_bytes"]},
                    {"measured_peak_bytes", o.contains("max_reserved_bytes") ? o["max_reserved_bytes"] : Json()}});
  }
  a.json["memory"] = {{"parts", parts}, {"rows", rows}, {"notes", t.notes}};
  a.tables.emplace_back("memory", std::move(t));
}

}  // namespace scalelab::analysis
