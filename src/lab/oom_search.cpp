#include "lab/oom_search.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/subprocess.h"
#include "lab/interrupted.h"
#include "lab/log_tail.h"
#include "lab/outcome.h"

namespace scalelab::lab {
namespace {

// Thrown by the probe to stop the search at a trial that neither fit nor ran out of memory.
struct SearchAborted {
  int micro_batch_size;
  TrialRow row;
};

}  // namespace

OomSearchTrace search_max_fit(const std::function<bool(int)>& probe, const OomSearchSettings& settings) {
  SCALELAB_CHECK_INPUT(settings.max_micro_batch >= 1, "[oom-search] --max-micro-batch must be at least 1");
  OomSearchTrace trace;
  std::map<int, bool> seen;
  auto fits = [&](int b) {
    auto it = seen.find(b);
    if (it != seen.end()) return it->second;
    bool r = probe(b);
    seen[b] = r;
    trace.probed.push_back(b);
    return r;
  };
  const int max = settings.max_micro_batch;
  int lo = 0;        // largest known to fit (0: none)
  int hi = INT_MAX;  // smallest known not to fit (INT_MAX: none)
  int start = std::clamp(settings.hint, 1, max);
  if (fits(start)) lo = start;
  else hi = start;
  if (hi == INT_MAX) {
    long long next = settings.hint_is_estimate ? lo + 1LL : 2LL * lo;
    for (;;) {
      if (lo >= max) {
        trace.capped = true;
        trace.max_fit = lo;
        return trace;
      }
      int b = static_cast<int>(std::min<long long>(next, max));
      if (fits(b)) {
        lo = b;
        next = 2LL * b;
      } else {
        hi = b;
        break;
      }
    }
  }
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  trace.max_fit = lo;
  return trace;
}

PlanFn native_plan(const TrialExecutor& exec) {
  const std::string engine = exec.options().engine;
  const std::string dir = exec.log_dir();
  const double timeout = std::min(exec.options().timeout_s, 300.0);
  const double grace = exec.options().kill_grace_s;
  const std::atomic<bool>* cancel = exec.options().cancel;
  std::vector<std::string> skip(exec.workload().label_params.begin(), exec.workload().label_params.end());
  skip.push_back(kSubcommandParam);
  return [=](const ParamMap& base, std::string* note) -> std::optional<int> {
    ParamMap p = base;
    p["micro_batch_size"] = 1;
    std::string hash = fnv1a_hex(Json(p).dump()).substr(0, 12);
    std::string json_path = (std::filesystem::path(dir) / ("plan-" + hash + ".json")).string();
    std::filesystem::remove(json_path);
    SubprocessSpec ps;
    ps.argv = {engine, "plan"};
    // A DPO trial's plan: `plan --dpo` (the reference log-probabilities' model counted).
    if (native_subcommand(p) == "dpo") ps.argv.push_back("--dpo");
    for (auto& f : params_to_flags(p, skip)) ps.argv.push_back(f);
    ps.argv.push_back("--json");
    ps.argv.push_back(json_path);
    ps.log_path = (std::filesystem::path(dir) / ("plan-" + hash + ".log")).string();
    ps.timeout_s = timeout;
    ps.kill_grace_s = grace;
    const SubprocessResult r = run_subprocess(ps, cancel);
    if (r.cancelled) throw Interrupted("[oom-search] interrupted while planning");
    if (!r.ok()) {
      std::string line = last_line(read_file_tail(ps.log_path, 1 << 16));
      *note = "unavailable (" + r.describe() + (line.empty() ? "" : ": " + line) + ")";
      return std::nullopt;
    }
    try {
      std::ifstream f(json_path);
      Json j = Json::parse(f);
      if (j.contains("max_micro_batch_size") && j["max_micro_batch_size"].is_number_integer() &&
          j["max_micro_batch_size"].get<long long>() >= 0) {
        return static_cast<int>(std::min<long long>(j["max_micro_batch_size"].get<long long>(), INT_MAX / 4));
      }
      *note = "unavailable (" + json_path + " has no max_micro_batch_size)";
    } catch (const std::exception& e) {
      *note = "unavailable (" + json_path + " is not valid JSON: " + e.what() + ")";
    }
    return std::nullopt;
  };
}

Json OomSearchResult::to_json() const {
  Json probes_json = Json::array();
  for (const auto& p : probes)
    probes_json.push_back({{"micro_batch_size", p.micro_batch_size}, {"trial_id", p.trial_id}, {"status", status_name(p.status)}});
  Json j{{"max_micro_batch_size", max_micro_batch_size},
         {"capped", capped},
         {"failed", failed},
         {"refused", refused},
         {"failure", failure},
         {"plan_estimate", plan_estimate ? Json(*plan_estimate) : Json()},
         {"plan_note", plan_note},
         {"probes", probes_json},
         {"best_trial_id", best ? Json(best->trial_id) : Json()},
         {"first_oom_trial_id", first_oom ? Json(first_oom->trial_id) : Json()}};
  return j;
}

OomSearchResult OomSearchResult::from_json(const Json& j) {
  OomSearchResult r;
  if (!j.is_object()) return r;
  r.max_micro_batch_size = j.value("max_micro_batch_size", 0);
  r.capped = j.value("capped", false);
  r.failed = j.value("failed", false);
  r.refused = j.value("refused", false);
  r.failure = j.value("failure", "");
  if (j.contains("plan_estimate") && j["plan_estimate"].is_number_integer()) r.plan_estimate = j["plan_estimate"].get<int>();
  r.plan_note = j.value("plan_note", "");
  if (j.contains("probes") && j["probes"].is_array()) {
    for (const auto& p : j["probes"]) {
      // A stored result is ours: an unknown name can only be a damaged row; it reads as an error.
      r.probes.push_back({p.value("micro_batch_size", 0), p.value("trial_id", static_cast<std::int64_t>(0)),
                          parse_status(p.value("status", "")).value_or(TrialStatus::kError)});
    }
  }
  return r;
}

std::string oom_search_key(const ParamMap& params) {
  ParamMap base = params;
  base.erase("micro_batch_size");
  return Json(base).dump();
}

OomSearchResult run_oom_search(TrialExecutor& exec, const OomSearchRequest& req, const PlanFn& plan) {
  OomSearchResult result;
  OomSearchSettings settings = req.settings;
  ParamMap base = req.base;
  base.erase("micro_batch_size");

  if (req.use_plan && plan) {
    std::string note;
    result.plan_estimate = plan(base, &note);
    result.plan_note = note;
    if (result.plan_estimate) {
      settings.hint = std::max(1, *result.plan_estimate);
      settings.hint_is_estimate = *result.plan_estimate > 0;
      exec.progress().note("memory plan: largest micro-batch " + std::to_string(*result.plan_estimate) +
                           "; verifying with trials");
    } else {
      exec.progress().note("memory plan " + note + "; searching by doubling and bisection");
    }
  }

  std::map<int, TrialRow> rows;
  auto probe = [&](int b) {
    ParamMap p = base;
    p["micro_batch_size"] = b;
    auto res = exec.run(p, 0, req.role, "micro_batch_size=" + std::to_string(b));
    if (res.cached) {
      exec.progress().note("micro_batch_size=" + std::to_string(b) + ": " + status_name(res.row.status) +
                           " (recorded trial " + std::to_string(res.row.trial_id) + ")");
    }
    rows[b] = res.row;
    result.probes.push_back({b, res.row.trial_id, res.row.status});
    if (res.row.status == TrialStatus::kOk) return true;
    if (res.row.status == TrialStatus::kOom) return false;
    throw SearchAborted{b, res.row};
  };
  try {
    OomSearchTrace trace = search_max_fit(probe, settings);
    result.max_micro_batch_size = trace.max_fit;
    result.capped = trace.capped;
    if (trace.max_fit > 0) result.best = rows.at(trace.max_fit);
    if (!trace.capped) result.first_oom = rows.at(trace.max_fit + 1);
  } catch (const SearchAborted& a) {
    result.failed = true;
    result.refused = a.row.exit_code && *a.row.exit_code == exit_code(ErrorKind::kInvalidInput);
    result.failure = "the trial at micro-batch " + std::to_string(a.micro_batch_size) + " ended with " +
                     status_name(a.row.status) + " (" + a.row.reason + "), neither a fit nor out of memory";
  }
  return result;
}

}  // namespace scalelab::lab
