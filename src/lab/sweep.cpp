#include "lab/sweep.h"

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
  return summary;
}

}  // namespace scalelab::lab
