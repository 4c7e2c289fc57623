#include "lab/sweep.h"

#include <set>

#include "lab/oom_search.h"

namespace scalelab::lab {

Json sweep_membership(const SweepSpec& spec) {
  Json hashes = Json::array();
  for (const auto& p : spec.expand()) hashes.push_back(fnv1a_hex(trial_config(spec.workload, p).dump()));
  return Json{{"configs", hashes}, {"repeats", spec.repeats}};
}

SweepRunSummary run_sweep(const SweepSpec& spec, ResultsStore& store, const LabOptions& options,
                          Progress& progress) {
  SweepRunSummary summary;
  summary.sweep_id = store.ensure_sweep(spec.name, "sweep", spec.to_json());
  store.set_sweep_result(summary.sweep_id, sweep_membership(spec));
  TrialExecutor exec(store, summary.sweep_id, spec.name, spec.workload, options, progress);
  summary.log_dir = exec.log_dir();

  const auto combos = spec.expand();
  const auto swept = spec.swept_parameters();
  summary.combinations = static_cast<int>(combos.size());
  summary.total = summary.combinations * spec.repeats;

  // Repeat-major order: every configuration once, then again, so that slow drift of the machine
  // spreads over all configurations instead of biasing the last ones.
  std::vector<std::pair<const ParamMap*, int>> todo;
  for (int r = 0; r < spec.repeats; ++r) {
    for (const auto& p : combos) {
      if (exec.recorded(p, r)) ++summary.already_done;
      else todo.emplace_back(&p, r);
    }
  }
  progress.set_total(static_cast<int>(todo.size()));
  if (summary.already_done > 0) {
    progress.note("sweep '" + spec.name + "': " + std::to_string(summary.already_done) + " of " +
                  std::to_string(summary.total) + " trials already in " + store.path() + ", running " +
                  std::to_string(todo.size()));
  } else {
    progress.note("sweep '" + spec.name + "': running " + std::to_string(todo.size()) + " trials (" +
                  std::to_string(summary.combinations) + " configurations x " + std::to_string(spec.repeats) +
                  " repeats)");
  }
  for (const auto& [params, r] : todo) {
    std::string label = params_label(*params, swept);
    if (label.empty()) label = "trial";
    if (spec.repeats > 1) label += " #" + std::to_string(r + 1);
    auto res = exec.run(*params, r, "sweep", label);
    ++summary.ran;
    if (res.row.status == TrialStatus::kOk) ++summary.ok;
    else if (res.row.status == TrialStatus::kOom) ++summary.oom;
    else ++summary.failed;
  }
  progress.finish();

  // [oom_search]: each configuration's limit (configurations that differ only in micro_batch_size
  // share one), with real trials; a trial the sweep already ran is reused by the search. The
  // limits join the sweep's stored result as they come, so an interrupted sweep keeps those found.
  if (spec.oom_search.enabled) {
    Json result = sweep_membership(spec);
    result["oom_limits"] = Json::array();
    std::set<std::string> seen;
    const PlanFn plan = spec.workload.is_native() && spec.oom_search.use_plan ? native_plan(exec) : PlanFn{};
    progress.set_total(0);  // a search's trial count is not known ahead: count them without a total
    for (const auto& p : combos) {
      const std::string key = oom_search_key(p);
      if (!seen.insert(key).second) continue;
      ParamMap base = p;
      base.erase("micro_batch_size");
      std::string label = params_label(base, swept);
      progress.note("OOM search" + (label.empty() ? std::string() : " for " + label));
      OomSearchRequest req;
      req.base = base;
      req.role = "oom-search";
      req.settings.max_micro_batch = spec.oom_search.max_micro_batch;
      if (auto it = p.find("micro_batch_size"); it != p.end() && it->second.is_number_integer())
        req.settings.hint = std::max(1, it->second.get<int>());  // without a plan: the sweep's own size first
      req.use_plan = static_cast<bool>(plan);
      const OomSearchResult r = run_oom_search(exec, req, plan);
      Json entry = r.to_json();
      entry["key"] = key;
      entry["params"] = Json(base);
      result["oom_limits"].push_back(entry);
      store.set_sweep_result(summary.sweep_id, result);
      ++summary.oom_searches;
    }
    progress.finish();
  }
  return summary;
}

}  // namespace scalelab::lab
