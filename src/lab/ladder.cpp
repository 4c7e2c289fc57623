#include "lab/ladder.h"

#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"

namespace scalelab::lab {

const std::vector<std::string> kLadderParameters = {"micro_batch_size", "model_precision", "mixed_precision",
                                                    "attn", "fused_kernels"};

ParamMap ladder_baseline() {
  return ParamMap{{"model_precision", "fp32"}, {"mixed_precision", "no"}, {"attn", "eager"}, {"fused_kernels", false}};
}

std::vector<RungSpec> default_rungs() {
  return {
      {"baseline", {}, false},
      {"baseline, max batch", {}, true},
      {"bf16 mixed precision", {{"mixed_precision", "bf16"}}, false},
      // Full bf16: weights, gradients and activations in bf16. Mixed precision is off because
      // there is no fp32 master copy left to mix with.
      {"full bf16", {{"model_precision", "bf16"}, {"mixed_precision", "no"}}, false},
      {"full bf16, larger batch", {}, true},
      {"flash attention", {{"attn", "flash"}}, false},
      {"flash attention, larger batch", {}, true},
      {"fused kernels", {{"fused_kernels", true}}, false},
      {"fused kernels, larger batch", {}, true},
  };
}

const char* rung_status_name(RungStatus s) {
  switch (s) {
    case RungStatus::kOk: return "ok";
    case RungStatus::kOom: return "oom";
    case RungStatus::kError: return "error";
    case RungStatus::kNotApplicable: return "n/a";
  }
  return "error";
}

std::optional<RungStatus> parse_rung_status(const std::string& name) {
  if (name == "ok") return RungStatus::kOk;
  if (name == "oom") return RungStatus::kOom;
  if (name == "error") return RungStatus::kError;
  if (name == "n/a") return RungStatus::kNotApplicable;
  return std::nullopt;
}

Json LadderResult::to_json() const {
  Json rs = Json::array();
  for (const auto& r : rungs) {
    Json p = Json::object();
    for (const auto& [k, v] : r.params) p[k] = v;
    rs.push_back({{"name", r.name},
                  {"status", rung_status_name(r.status)},
                  {"note", r.note},
                  {"params", p},
                  {"micro_batch_size", r.micro_batch_size},
                  {"trial_id", r.trial_id ? Json(*r.trial_id) : Json()},
                  {"plan_estimate", r.plan_estimate ? Json(*r.plan_estimate) : Json()}});
  }
  return Json{{"rungs", rs}};
}

LadderResult LadderResult::from_json(const Json& j) {
  LadderResult out;
  if (!j.is_object() || !j.contains("rungs") || !j["rungs"].is_array()) return out;
  for (const auto& r : j["rungs"]) {
    RungResult rr;
    rr.name = r.value("name", "");
    // A stored result is ours: an unknown name can only be a damaged row; it reads as an error.
    rr.status = parse_rung_status(r.value("status", "")).value_or(RungStatus::kError);
    rr.note = r.value("note", "");
    if (r.contains("params") && r["params"].is_object())
      for (auto it = r["params"].begin(); it != r["params"].end(); ++it) rr.params[it.key()] = it.value();
    rr.micro_batch_size = r.value("micro_batch_size", 0);
    if (r.contains("trial_id") && r["trial_id"].is_number_integer()) rr.trial_id = r["trial_id"].get<std::int64_t>();
    if (r.contains("plan_estimate") && r["plan_estimate"].is_number_integer())
      rr.plan_estimate = r["plan_estimate"].get<int>();
    out.rungs.push_back(std::move(rr));
  }
  return out;
}

namespace {

std::string config_key(const ParamMap& p) {
  ParamMap q = p;
  q.erase("micro_batch_size");
  return Json(q).dump();
}

}  // namespace

LadderResult run_ladder(TrialExecutor& exec, const LadderRequest& req, const PlanFn& plan) {
  const Workload& w = exec.workload();
  for (const auto& k : kLadderParameters) {
    if (k != "micro_batch_size" && req.base.count(k)) {
      throw InvalidInput("[ladder] the ladder sets " + param_flag(k) + " itself at each rung — remove it");
    }
  }
  SCALELAB_CHECK_INPUT(req.start_micro_batch >= 1, "[ladder] the baseline micro-batch must be at least 1");

  LadderResult out;
  ParamMap cur = req.base;
  for (const auto& [k, v] : ladder_baseline()) cur[k] = v;
  cur.erase("micro_batch_size");
  int batch = req.start_micro_batch;
  std::map<std::string, std::string> searched;  // config -> rung that searched it
  const int n = static_cast<int>(req.rungs.size());

  for (int i = 0; i < n; ++i) {
    const RungSpec& spec = req.rungs[i];
    RungResult r;
    r.name = spec.name;
    exec.progress().note("== rung " + std::to_string(i + 1) + "/" + std::to_string(n) + ": " + spec.name + " ==");
    const std::string role = "ladder: " + spec.name;

    if (spec.search) {
      auto prev = searched.find(config_key(cur));
      if (prev != searched.end()) {
        r.status = RungStatus::kNotApplicable;
        r.note = "this configuration's largest micro-batch was already searched at '" + prev->second + "'";
        out.rungs.push_back(r);
        if (req.on_rung) req.on_rung(out);
        continue;
      }
      searched[config_key(cur)] = spec.name;
      OomSearchRequest sreq;
      sreq.base = cur;
      sreq.role = role;
      sreq.settings.hint = batch;
      sreq.settings.max_micro_batch = req.max_micro_batch;
      sreq.use_plan = req.use_plan;
      OomSearchResult s = run_oom_search(exec, sreq, plan);
      r.plan_estimate = s.plan_estimate;
      if (s.failed) {
        r.status = s.refused ? RungStatus::kNotApplicable : RungStatus::kError;
        r.note = s.failure;
      } else if (s.max_micro_batch_size == 0) {
        r.status = RungStatus::kOom;
        r.note = "micro-batch 1 does not fit";
      } else {
        batch = s.max_micro_batch_size;
        r.status = RungStatus::kOk;
        r.micro_batch_size = batch;
        r.params = cur;
        r.params["micro_batch_size"] = batch;
        r.trial_id = s.best->trial_id;
        r.note = s.capped ? "the search stopped at --max-micro-batch " + std::to_string(batch) + ", which fits"
                          : std::to_string(batch + 1) + " runs out of memory";
        if (s.plan_estimate) r.note += "; plan estimated " + std::to_string(*s.plan_estimate);
      }
      out.rungs.push_back(r);
      if (req.on_rung) req.on_rung(out);
      continue;
    }

    // A switch rung (or the baseline): the changes this workload can express.
    ParamMap cand = cur;
    std::vector<std::string> missing;
    bool changed = false;
    for (const auto& [k, v] : spec.set) {
      if (cur.count(k) && cur.at(k) == v) continue;
      if (!w.uses_parameter(k)) {
        missing.push_back("{" + k + "}");
        continue;
      }
      cand[k] = v;
      changed = true;
    }
    if (!spec.set.empty() && !changed) {
      r.status = RungStatus::kNotApplicable;
      std::string list;
      for (const auto& m : missing) append_item(list, m, ", ");
      r.note = missing.empty() ? "already in effect" : "the command template has no " + list + " placeholder";
      out.rungs.push_back(r);
      if (req.on_rung) req.on_rung(out);
      continue;
    }
    ParamMap p = cand;
    p["micro_batch_size"] = batch;
    auto res = exec.run(p, 0, role, spec.name + ", micro_batch_size=" + std::to_string(batch));
    const TrialRow& row = res.row;
    if (row.status == TrialStatus::kOk) {
      cur = cand;
      r.status = RungStatus::kOk;
      r.micro_batch_size = batch;
      r.params = p;
      r.trial_id = row.trial_id;
    } else if (row.status == TrialStatus::kOom) {
      // The switch costs memory at this micro-batch: find what fits with it.
      OomSearchRequest sreq;
      sreq.base = cand;
      sreq.role = role;
      sreq.settings.hint = batch;
      sreq.settings.max_micro_batch = req.max_micro_batch;
      sreq.use_plan = false;
      OomSearchResult s = run_oom_search(exec, sreq, plan);
      if (!s.failed && s.max_micro_batch_size > 0) {
        cur = cand;
        searched[config_key(cur)] = spec.name;
        r.status = RungStatus::kOk;
        r.note = "micro-batch " + std::to_string(batch) + " ran out of memory; lowered to " +
                 std::to_string(s.max_micro_batch_size);
        batch = s.max_micro_batch_size;
        r.micro_batch_size = batch;
        r.params = cand;
        r.params["micro_batch_size"] = batch;
        r.trial_id = s.best->trial_id;
      } else {
        r.status = s.failed ? (s.refused ? RungStatus::kNotApplicable : RungStatus::kError) : RungStatus::kOom;
        r.note = s.failed ? s.failure : "micro-batch 1 does not fit";
      }
    } else if (row.exit_code && *row.exit_code == exit_code(ErrorKind::kInvalidInput)) {
      r.status = RungStatus::kNotApplicable;
      r.note = "the workload refused it: " + row.reason;
    } else {
      r.status = RungStatus::kError;
      r.note = std::string(status_name(row.status)) + ": " + row.reason;
    }
    out.rungs.push_back(r);
    if (req.on_rung) req.on_rung(out);
  }
  return out;
}

Table ladder_table(const LadderResult& ladder, const ResultsStore& store) {
  Table t;
  t.columns = {{"rung", "rung", CellFormat::kText},
               {"devices", "devices", CellFormat::kInt},
               {"micro_batch_size", "micro-batch", CellFormat::kInt},
               {"model_precision", "model precision", CellFormat::kText},
               {"mixed_precision", "mixed precision", CellFormat::kText},
               {"attn", "attention", CellFormat::kText},
               {"fused_kernels", "fused", CellFormat::kText},
               {"tokens_per_s_per_device", "tokens/s/device", CellFormat::kFixed1},
               {"memory_gib", "memory GiB", CellFormat::kFixed2},
               {"speedup", "speedup", CellFormat::kRatio},
               {"status", "status", CellFormat::kText},
               {"note", "note", CellFormat::kText}};
  std::optional<double> baseline;
  std::optional<double> prev_tps;
  std::string prev_name;
  double best_jump = 0;
  std::string jump_text;
  int jump_row = -1;
  for (const auto& r : ladder.rungs) {
    Json row{{"rung", r.name}, {"status", rung_status_name(r.status)}, {"note", r.note}};
    if (r.trial_id) row["trial_id"] = *r.trial_id;
    if (!r.params.empty()) {
      for (const char* k : {"model_precision", "mixed_precision", "attn"}) {
        auto it = r.params.find(k);
        if (it != r.params.end()) row[k] = it->second;
      }
      auto f = r.params.find("fused_kernels");
      if (f != r.params.end()) row["fused_kernels"] = (f->second.is_boolean() && f->second.get<bool>()) ? "yes" : "no";
      auto np = r.params.find("nproc");
      row["devices"] = np != r.params.end() && np->second.is_number() ? np->second : Json(1);
      row["micro_batch_size"] = r.micro_batch_size;
    }
    std::optional<double> tps;
    if (r.trial_id) {
      if (auto trial = store.trial(*r.trial_id)) {
        const Json& m = trial->metrics;
        if (m.contains("tokens_per_s_per_device")) tps = m["tokens_per_s_per_device"].get<double>();
        if (m.contains("max_reserved_gib")) row["memory_gib"] = m["max_reserved_gib"];
        if (tps) row["tokens_per_s_per_device"] = *tps;
      } else {
        row["note"] = r.note + (r.note.empty() ? "" : "; ") + "trial " + std::to_string(*r.trial_id) + " is missing";
      }
    }
    if (tps && r.status == RungStatus::kOk) {
      if (!baseline) baseline = *tps;
      if (*baseline > 0) row["speedup"] = *tps / *baseline;
      if (prev_tps && *prev_tps > 0) {
        double jump = *tps / *prev_tps;
        if (jump > best_jump) {
          best_jump = jump;
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.2fx", jump);
          jump_text = "Largest single jump: '" + r.name + "', " + buf + " over '" + prev_name + "'";
          jump_row = static_cast<int>(t.rows.size());
        }
      }
      prev_tps = tps;
      prev_name = r.name;
    }
    t.rows.push_back(std::move(row));
  }
  for (std::size_t i = 0; i < t.rows.size(); ++i) t.rows[i]["largest_jump"] = static_cast<int>(i) == jump_row;
  if (!jump_text.empty()) t.notes.push_back(jump_text);
  if (baseline && !ladder.rungs.empty() && ladder.rungs[0].status != RungStatus::kOk) {
    t.notes.push_back("The baseline did not run; speedups are over the first measured rung.");
  }
  return t;
}

}  // namespace scalelab::lab
