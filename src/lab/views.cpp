#include "lab/views.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "core/error.h"
#include "lab/ladder.h"
#include "lab/oom_search.h"

namespace scalelab::lab {
namespace {

std::optional<double> as_number(const Json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return d;
  }
  return std::nullopt;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Parameters whose value differs among the rows (all of them when there is one row), those named
// in `order` first, in that order.
std::vector<std::string> varying_params(const std::vector<TrialRow>& rows, const std::vector<std::string>& order_hint) {
  std::map<std::string, std::set<std::string>> seen;
  std::vector<std::string> order;
  for (const auto& r : rows) {
    for (const auto& [k, v] : r.params()) {
      if (!seen.count(k)) order.push_back(k);
      seen[k].insert(v.dump());
    }
  }
  std::vector<std::string> sorted;
  for (const auto& k : order_hint)
    if (seen.count(k)) sorted.push_back(k);
  for (const auto& k : order)
    if (std::find(sorted.begin(), sorted.end(), k) == sorted.end()) sorted.push_back(k);
  std::vector<std::string> out;
  for (const auto& k : sorted) {
    bool everywhere = std::all_of(rows.begin(), rows.end(), [&](const TrialRow& r) { return r.params().count(k) > 0; });
    if (rows.size() <= 1 || seen[k].size() > 1 || !everywhere) out.push_back(k);
  }
  return out;
}

}  // namespace

Filter parse_filter(const std::string& text) {
  static const char* const ops[] = {"!=", "<=", ">=", "==", "=", "<", ">"};
  for (const char* op : ops) {
    auto pos = text.find(op);
    if (pos == std::string::npos || pos == 0) continue;
    // The first operator character in the text decides ("a<=b": "<=" not "=").
    auto first = text.find_first_of("!<>=");
    if (pos != first) continue;
    Filter f{text.substr(0, pos), op, text.substr(pos + std::string(op).size())};
    if (f.op == "==") f.op = "=";
    while (!f.key.empty() && f.key.back() == ' ') f.key.pop_back();
    while (!f.value.empty() && f.value.front() == ' ') f.value.erase(f.value.begin());
    f.key = param_name(f.key);
    if (!f.key.empty()) return f;
  }
  throw InvalidInput("[results] cannot read the filter '" + text +
                     "' — write key=value, key!=value, key<value, key<=value, key>value or key>=value "
                     "(e.g. status=ok, micro_batch_size>=4)");
}

bool filter_matches(const Json& object, const Filter& f) {
  auto it = object.find(f.key);
  if (it == object.end() || it->is_null()) return f.op == "!=";
  auto a = as_number(*it);
  auto b = as_number(Json(f.value));
  int cmp;
  if (a && b && !it->is_string()) cmp = *a < *b ? -1 : (*a > *b ? 1 : 0);
  else {
    std::string s = param_text(*it);
    cmp = s < f.value ? -1 : (s > f.value ? 1 : 0);
  }
  if (f.op == "=") return cmp == 0;
  if (f.op == "!=") return cmp != 0;
  if (f.op == "<") return cmp < 0;
  if (f.op == "<=") return cmp <= 0;
  if (f.op == ">") return cmp > 0;
  return cmp >= 0;
}

std::vector<Json> apply_filters(const std::vector<Json>& objects, const std::vector<Filter>& filters) {
  if (!objects.empty()) {
    for (const auto& f : filters) {
      bool known = std::any_of(objects.begin(), objects.end(), [&](const Json& o) { return o.contains(f.key); });
      if (!known) {
        std::set<std::string> keys;
        for (const auto& o : objects)
          for (auto it = o.begin(); it != o.end(); ++it) keys.insert(it.key());
        std::string list;
        for (const auto& k : keys) append_item(list, k, ", ");
        throw InvalidInput("[results] no row has a field '" + f.key + "' to filter on — fields: " + list);
      }
    }
  }
  std::vector<Json> out;
  for (const auto& o : objects) {
    bool keep = std::all_of(filters.begin(), filters.end(), [&](const Filter& f) { return filter_matches(o, f); });
    if (keep) out.push_back(o);
  }
  return out;
}

Json flatten_trial(const TrialRow& r) {
  Json o{{"trial_id", r.trial_id},
         {"sweep", r.sweep_name},
         {"repeat", r.repeat},
         {"role", r.role},
         {"status", status_name(r.status)},
         {"reason", r.reason},
         {"exit_code", r.exit_code ? Json(*r.exit_code) : Json()},
         {"signal", r.signal ? Json(*r.signal) : Json()},
         {"duration_s", r.duration_s},
         {"host", r.host},
         {"started_at", r.started_at},
         {"ended_at", r.ended_at},
         {"log_path", r.log_path},
         {"config_hash", r.config_hash},
         {"command", r.command},
         {"scalelab_version", r.scalelab_version},
         {"git_rev", r.git_rev}};
  for (const auto& [k, v] : r.params())
    if (!o.contains(k)) o[k] = v;
  for (auto it = r.metrics.begin(); it != r.metrics.end(); ++it)
    if (!o.contains(it.key())) o[it.key()] = it.value();
  if (r.metrics.contains("max_reserved_gib")) o["memory_gib"] = r.metrics["max_reserved_gib"];
  if (!r.telemetry_summary.is_null()) o["telemetry_summary"] = r.telemetry_summary;
  return o;
}

std::vector<std::string> parameter_order(const SweepRow& sweep) {
  std::vector<std::string> out;
  if (sweep.spec.is_object() && sweep.spec.contains("parameter_order") && sweep.spec["parameter_order"].is_array())
    for (const auto& n : sweep.spec["parameter_order"])
      if (n.is_string()) out.push_back(n.get<std::string>());
  return out;
}

std::map<std::string, std::vector<std::string>> preset_parameters(const SweepRow& sweep) {
  std::map<std::string, std::vector<std::string>> out;
  if (!sweep.spec.is_object() || !sweep.spec.contains("presets") || !sweep.spec["presets"].is_object()) return out;
  for (auto p = sweep.spec["presets"].begin(); p != sweep.spec["presets"].end(); ++p) {
    std::set<std::string> implied;
    if (p.value().is_object())
      for (auto v = p.value().begin(); v != p.value().end(); ++v)
        if (v.value().is_object())
          for (auto k = v.value().begin(); k != v.value().end(); ++k) implied.insert(k.key());
    out[p.key()] = std::vector<std::string>(implied.begin(), implied.end());
  }
  return out;
}

void fold_preset_columns(Table& t, const SweepRow& sweep) {
  for (const auto& [preset, implied] : preset_parameters(sweep)) {
    const std::string& name = preset;  // a plain reference: clang before 16 cannot capture a structured binding
    const bool shown = std::any_of(t.columns.begin(), t.columns.end(), [&](const Column& c) { return c.key == name; });
    if (!shown) continue;  // the preset does not vary here: its parameters stay as they are
    std::string folded;
    for (auto& c : t.columns)
      if (!c.folded && std::find(implied.begin(), implied.end(), c.key) != implied.end()) {
        c.folded = true;
        append_item(folded, c.key, ", ");
      }
    if (!folded.empty())
      t.notes.push_back("`" + name + "` stands for its preset's parameters (" + folded +
                        "): folded into its column here; --format csv or json lists them.");
  }
}

Table sweeps_table(const ResultsStore& store) {
  Table t;
  t.columns = {{"sweep", "sweep"},        {"kind", "kind"},       {"trials", "trials", CellFormat::kInt},
               {"ok", "ok", CellFormat::kInt}, {"oom", "oom", CellFormat::kInt}, {"failed", "failed", CellFormat::kInt},
               {"created_at", "created"}, {"updated_at", "updated"}};
  for (const auto& s : store.sweeps()) {
    int n = 0, ok = 0, oom = 0, failed = 0;
    for (const auto& r : store.trials(s.sweep_id)) {
      ++n;
      if (r.status == TrialStatus::kOk) ++ok;
      else if (r.status == TrialStatus::kOom) ++oom;
      else ++failed;
    }
    t.rows.push_back({{"sweep", s.name}, {"kind", s.kind}, {"trials", n}, {"ok", ok}, {"oom", oom},
                      {"failed", failed}, {"created_at", s.created_at}, {"updated_at", s.updated_at}});
  }
  if (t.rows.empty()) t.notes.push_back("No sweeps in " + store.path() + " yet.");
  return t;
}

Table trials_table(const std::vector<TrialRow>& rows_in, const std::vector<Filter>& filters,
                   const std::vector<std::string>& param_order) {
  std::vector<Json> objects;
  for (const auto& r : rows_in) objects.push_back(flatten_trial(r));
  objects = apply_filters(objects, filters);
  std::vector<TrialRow> kept;
  std::set<std::int64_t> ids;
  for (const auto& o : objects) ids.insert(o["trial_id"].get<std::int64_t>());
  for (const auto& r : rows_in)
    if (ids.count(r.trial_id)) kept.push_back(r);

  Table t;
  t.columns = {{"trial_id", "trial", CellFormat::kInt}, {"sweep", "sweep"}, {"repeat", "repeat", CellFormat::kInt},
               {"status", "status"}};
  for (const auto& p : varying_params(rows_in, param_order)) t.columns.push_back({p, p});
  t.columns.push_back({"tokens_per_s_per_device", "tokens/s/device", CellFormat::kFixed1});
  t.columns.push_back({"memory_gib", "memory GiB", CellFormat::kFixed2});
  t.columns.push_back({"step_time_s", "step s", CellFormat::kFixed3});
  t.columns.push_back({"duration_s", "wall s", CellFormat::kFixed1});
  t.columns.push_back({"reason", "reason"});
  t.columns.push_back({"log_path", "log"});
  t.rows = objects;
  return t;
}

Table summary_table(const std::vector<TrialRow>& rows_in, const std::vector<Filter>& filters,
                    const std::vector<std::string>& param_order) {
  std::vector<Json> objects;
  for (const auto& r : rows_in) objects.push_back(flatten_trial(r));
  objects = apply_filters(objects, filters);
  std::set<std::int64_t> ids;
  for (const auto& o : objects) ids.insert(o["trial_id"].get<std::int64_t>());
  std::vector<TrialRow> rows;
  for (const auto& r : rows_in)
    if (ids.count(r.trial_id)) rows.push_back(r);

  std::vector<std::string> order;
  std::map<std::string, std::vector<const TrialRow*>> groups;
  for (const auto& r : rows) {
    if (!groups.count(r.config_hash)) order.push_back(r.config_hash);
    groups[r.config_hash].push_back(&r);
  }
  const auto params = varying_params(rows_in, param_order);
  Table t;
  for (const auto& p : params) t.columns.push_back({p, p});
  t.columns.push_back({"runs", "runs", CellFormat::kInt});
  t.columns.push_back({"status", "status"});
  t.columns.push_back({"tokens_per_s_per_device", "tokens/s/device (median)", CellFormat::kFixed1});
  t.columns.push_back({"tokens_per_s_per_device_min", "min", CellFormat::kFixed1});
  t.columns.push_back({"tokens_per_s_per_device_max", "max", CellFormat::kFixed1});
  t.columns.push_back({"memory_gib", "memory GiB", CellFormat::kFixed2});
  t.columns.push_back({"step_time_s", "step s", CellFormat::kFixed3});
  t.columns.push_back({"reason", "reason"});
  for (const auto& h : order) {
    const auto& g = groups[h];
    Json row = Json::object();
    ParamMap pm = g.front()->params();
    for (const auto& p : params) row[p] = pm.count(p) ? pm[p] : Json();
    row["config_hash"] = h;
    row["runs"] = static_cast<int>(g.size());
    std::map<std::string, int> counts;
    std::vector<double> tps, mem, step;
    std::string reason;
    Json trial_ids = Json::array();
    for (const TrialRow* r : g) {
      ++counts[status_name(r->status)];
      trial_ids.push_back(r->trial_id);
      if (r->status == TrialStatus::kOk) {
        if (r->metrics.contains("tokens_per_s_per_device")) tps.push_back(r->metrics["tokens_per_s_per_device"].get<double>());
        if (r->metrics.contains("max_reserved_gib")) mem.push_back(r->metrics["max_reserved_gib"].get<double>());
        if (r->metrics.contains("step_time_s")) step.push_back(r->metrics["step_time_s"].get<double>());
      } else if (reason.empty()) {
        reason = r->reason;
      }
    }
    if (counts.size() == 1) row["status"] = counts.begin()->first;
    else {
      std::string s;
      for (const auto& [k, n] : counts) append_item(s, k + " " + std::to_string(n), ", ");
      row["status"] = s;
    }
    if (!tps.empty()) {
      row["tokens_per_s_per_device"] = median(tps);
      row["tokens_per_s_per_device_min"] = *std::min_element(tps.begin(), tps.end());
      row["tokens_per_s_per_device_max"] = *std::max_element(tps.begin(), tps.end());
    }
    if (!mem.empty()) row["memory_gib"] = median(mem);
    if (!step.empty()) row["step_time_s"] = median(step);
    row["reason"] = reason;
    row["trial_ids"] = trial_ids;
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::vector<TrialRow> member_trials(const SweepRow& sweep, const ResultsStore& store) {
  std::vector<TrialRow> rows = store.trials(sweep.sweep_id);
  const Json& m = sweep.result;
  if (sweep.kind == "sweep" && m.is_object() && m.contains("configs") && m["configs"].is_array()) {
    std::map<std::string, std::size_t> rank;
    for (const auto& h : m["configs"])
      if (h.is_string()) rank.emplace(h.get<std::string>(), rank.size());
    const int repeats = m.value("repeats", 1);
    std::vector<TrialRow> kept;
    for (auto& r : rows)
      if (rank.count(r.config_hash) && r.repeat < repeats) kept.push_back(std::move(r));
    std::stable_sort(kept.begin(), kept.end(), [&](const TrialRow& a, const TrialRow& b) {
      return rank.at(a.config_hash) < rank.at(b.config_hash);
    });
    rows = std::move(kept);
  }
  return rows;
}

Table sweep_summary_table(const SweepRow& sweep, const ResultsStore& store, const std::vector<Filter>& filters) {
  std::vector<TrialRow> rows = member_trials(sweep, store);
  const Json& m = sweep.result;
  Table t = summary_table(rows, filters, parameter_order(sweep));
  // [oom_search]: each configuration's largest fitting micro-batch, beside its trials' figures.
  if (m.is_object() && m.contains("oom_limits") && m["oom_limits"].is_array()) {
    std::map<std::string, const Json*> limits;
    for (const auto& e : m["oom_limits"])
      if (e.is_object() && e.contains("key") && e["key"].is_string()) limits[e["key"].get<std::string>()] = &e;
    std::map<std::string, std::string> key_of;  // config hash -> its search's key
    for (const auto& r : rows) key_of.emplace(r.config_hash, oom_search_key(r.params()));
    auto runs = std::find_if(t.columns.begin(), t.columns.end(), [](const Column& c) { return c.key == "runs"; });
    t.columns.insert(runs, {"max_micro_batch_size", "max micro-batch", CellFormat::kText});
    int capped = 0;
    std::vector<std::string> failures;
    for (auto& row : t.rows) {
      const auto k = key_of.find(row.value("config_hash", std::string()));
      const auto it = k == key_of.end() ? limits.end() : limits.find(k->second);
      if (it == limits.end()) continue;
      const OomSearchResult res = OomSearchResult::from_json(*it->second);
      if (res.failed) {
        row["max_micro_batch_size"] = "failed";
        failures.push_back(res.failure);
      } else if (res.capped) {
        row["max_micro_batch_size"] = ">= " + std::to_string(res.max_micro_batch_size);
        ++capped;
      } else {
        row["max_micro_batch_size"] = std::to_string(res.max_micro_batch_size);
      }
    }
    t.notes.push_back("max micro-batch: the largest micro-batch that fits each configuration, verified by trials (it "
                      "fits, one more runs out of memory; `results --sweep " + sweep.name + " --view trials` lists "
                      "the search's trials)." +
                      (capped ? " \">= N\": the search stopped at [oom_search] max_micro_batch." : std::string()));
    for (const auto& f : failures) t.notes.push_back("An OOM search stopped: " + f);
    if (limits.size() < key_of.size() && !key_of.empty())
      t.notes.push_back("Some configurations have no OOM search result yet (the sweep was interrupted): run it again.");
  }
  fold_preset_columns(t, sweep);  // [presets.NAME]: the label, not the parameters it sets
  return t;
}

Table oom_search_table(const SweepRow& sweep, const ResultsStore& store, const std::vector<Filter>& filters) {
  OomSearchResult res = OomSearchResult::from_json(sweep.result);
  std::vector<Json> objects;
  for (const auto& p : res.probes) {
    Json o{{"micro_batch_size", p.micro_batch_size}, {"trial_id", p.trial_id}, {"status", status_name(p.status)}};
    if (auto tr = store.trial(p.trial_id)) {
      if (tr->metrics.contains("tokens_per_s_per_device")) o["tokens_per_s_per_device"] = tr->metrics["tokens_per_s_per_device"];
      if (tr->metrics.contains("max_reserved_gib")) o["memory_gib"] = tr->metrics["max_reserved_gib"];
      o["reason"] = tr->reason;
    }
    objects.push_back(std::move(o));
  }
  Table t;
  t.columns = {{"micro_batch_size", "micro-batch", CellFormat::kInt}, {"status", "status"},
               {"tokens_per_s_per_device", "tokens/s/device", CellFormat::kFixed1},
               {"memory_gib", "memory GiB", CellFormat::kFixed2}, {"trial_id", "trial", CellFormat::kInt},
               {"reason", "reason"}};
  t.rows = apply_filters(objects, filters);
  if (sweep.result.is_null()) {
    t.notes.push_back("The search did not finish (no result recorded); run it again to resume.");
  } else if (res.failed) {
    t.notes.push_back("The search stopped: " + res.failure);
  } else if (res.max_micro_batch_size == 0) {
    t.notes.push_back("No micro-batch fits: micro-batch 1 runs out of memory.");
  } else if (res.capped) {
    t.notes.push_back("Largest micro-batch tried: " + std::to_string(res.max_micro_batch_size) +
                      " fits (the search stopped at --max-micro-batch; the limit is at least this).");
  } else {
    t.notes.push_back("Largest micro-batch that fits: " + std::to_string(res.max_micro_batch_size) + " (verified: " +
                      std::to_string(res.max_micro_batch_size) + " fits, " +
                      std::to_string(res.max_micro_batch_size + 1) + " runs out of memory).");
  }
  if (res.plan_estimate) t.notes.push_back("Memory plan estimate: " + std::to_string(*res.plan_estimate) + ".");
  else if (!res.plan_note.empty()) t.notes.push_back("Memory plan: " + res.plan_note + ".");
  return t;
}

Table ladder_sweep_table(const SweepRow& sweep, const ResultsStore& store, const std::vector<Filter>& filters) {
  Table t = ladder_table(LadderResult::from_json(sweep.result), store);
  t.rows = apply_filters(t.rows, filters);
  if (sweep.result.is_null()) t.notes.push_back("The ladder did not finish (no result recorded); run it again to resume.");
  return t;
}

namespace {

// A trial's stored profile (record.profile: a native --profile run's, or an external workload's
// nsys / torch profile), or null.
const Json* stored_profile(const TrialRow& r) {
  if (!r.record.is_object()) return nullptr;
  const auto it = r.record.find("profile");
  if (it == r.record.end() || !it->is_object()) return nullptr;
  return &*it;
}

const Json* stored_summary(const TrialRow& r) {
  const Json* p = stored_profile(r);
  if (p == nullptr) return nullptr;
  const auto it = p->find("summary");
  return it != p->end() && it->is_object() ? &*it : nullptr;
}

// The table whose rows become a profile view's columns: the engine's op families, nsys's GPU
// kernels, PyTorch's kernels (its CPU ops when the trace has no kernels).
const Json* main_table(const Json& summary) {
  const std::string source = summary.value("source", "");
  std::vector<std::string> ids = {"op_families"};
  if (source == "nsys") ids = {"cuda_gpu_kern_sum"};
  else if (source == "pytorch") ids = {"kernels", "cpu_ops"};
  if (!summary.contains("tables") || !summary.at("tables").is_array()) return nullptr;
  for (const auto& id : ids)
    for (const auto& tb : summary.at("tables"))
      if (tb.is_object() && tb.value("id", "") == id) return &tb;
  return nullptr;
}

// The most columns of names (kernels) an external profile adds to the profile view.
constexpr std::size_t kMaxNameColumns = 8;

}  // namespace

Table profile_table(const std::vector<TrialRow>& rows_in, const std::vector<Filter>& filters,
                    const std::vector<std::string>& param_order) {
  std::vector<Json> objects;
  for (const auto& r : rows_in) objects.push_back(flatten_trial(r));
  objects = apply_filters(objects, filters);
  std::set<std::int64_t> ids;
  for (const auto& o : objects) ids.insert(o["trial_id"].get<std::int64_t>());

  // The main table of each profiled trial, and its names' totals over all of them.
  std::map<std::string, double> family_total;
  std::vector<std::pair<const TrialRow*, const Json*>> profiled;
  std::size_t without = 0;
  bool all_native = true, any_native = false;
  for (const auto& r : rows_in) {
    if (!ids.count(r.trial_id)) continue;
    const Json* summary = stored_summary(r);
    const Json* fams = summary ? main_table(*summary) : nullptr;  // points into r.record (not into a copy)
    if (fams == nullptr) {
      ++without;
      continue;
    }
    const bool native = summary->value("source", "") == "scalelab";
    all_native = all_native && native;
    any_native = any_native || native;
    for (const auto& row : fams->value("rows", Json::array()))
      family_total[row.value("name", "")] += row.value("total", 0.0);
    profiled.emplace_back(&r, fams);
  }
  std::vector<std::string> families;
  for (const auto& [name, total] : family_total) families.push_back(name);
  std::stable_sort(families.begin(), families.end(),
                   [&](const std::string& a, const std::string& b) { return family_total[a] > family_total[b]; });
  std::size_t left_out = 0;
  if (!all_native && families.size() > kMaxNameColumns) {
    left_out = families.size() - kMaxNameColumns;
    families.resize(kMaxNameColumns);
  }

  Table t;
  t.columns = {{"trial_id", "trial", CellFormat::kInt}, {"status", "status"}};
  for (const auto& p : varying_params(rows_in, param_order)) t.columns.push_back({p, p});
  if (any_native) {
    t.columns.push_back({"step_time_s", "step s (median)", CellFormat::kFixed3});
    t.columns.push_back({"op_time_fraction", "in ops %", CellFormat::kFixed1});
  }
  for (const auto& f : families) {
    std::string title = f.size() > 48 ? f.substr(0, 45) + "..." : f;
    t.columns.push_back({"pct_" + f, title + " %", CellFormat::kFixed1});
  }
  for (const auto& [r, fams] : profiled) {
    Json row = Json::object();
    const Json flat = flatten_trial(*r);
    row["trial_id"] = r->trial_id;
    row["status"] = flat.value("status", "");
    for (const auto& c : t.columns)
      if (!row.contains(c.key) && flat.contains(c.key)) row[c.key] = flat[c.key];
    const Json derived = stored_summary(*r)->value("derived", Json::object());
    if (derived.contains("step_time_median_s")) row["step_time_s"] = derived["step_time_median_s"];
    if (derived.contains("op_time_fraction_of_steps"))
      row["op_time_fraction"] = 100.0 * derived["op_time_fraction_of_steps"].get<double>();
    for (const auto& fr : fams->value("rows", Json::array()))
      row["pct_" + fr.value("name", "")] = fr.value("time_percent", 0.0);
    t.rows.push_back(std::move(row));
  }
  if (without > 0) {
    t.notes.push_back(std::to_string(without) +
                      " trial(s) without a profile (run with --profile to record one; an external command: "
                      "[workload] profile = \"nsys\" or \"torch\")");
  }
  if (all_native) {
    t.notes.push_back("each family's share of the op time of the measured steps (Time % as nsys stats prints it)");
  } else {
    t.notes.push_back("external trials: each GPU kernel's share of the kernel time (Time % as nsys stats prints it)");
    if (left_out > 0) {
      t.notes.push_back(std::to_string(left_out) + " more kernel(s) not shown; `--format json` or `scalelab "
                        "profile-summary` on a trial's stats file has them all");
    }
  }
  return t;
}

Table profile_compare_table(const std::vector<TrialRow>& rows_in, const std::vector<Filter>& filters,
                            const std::vector<std::string>& param_order, bool with_sweep) {
  // Derived figures, in the order a reader compares them (the reference study's first); others
  // follow by name.
  static const std::vector<std::pair<std::string, std::pair<std::string, CellFormat>>> known = {
      {"launch_api_s", {"launch API s", CellFormat::kSig4}},
      {"sync_api_s", {"sync API s", CellFormat::kSig4}},
      {"memcpy_htod_s", {"memcpy HtoD s", CellFormat::kSig4}},
      {"memcpy_htod_mb", {"memcpy HtoD MB", CellFormat::kSig4}},
      {"memcpy_htod_gb_per_s", {"HtoD GB/s", CellFormat::kSig4}},
      {"nccl_kernel_s", {"NCCL kernels s", CellFormat::kSig4}},
      {"device_idle_fraction", {"device idle", CellFormat::kFixed3}},
      {"step_time_median_s", {"step s (median)", CellFormat::kSig4}},
      {"op_time_fraction_of_steps", {"in ops", CellFormat::kFixed3}},
      {"comm_time_s", {"comm s", CellFormat::kSig4}},
      {"comm_exposed_s", {"comm exposed s", CellFormat::kSig4}},
      {"comm_hidden_fraction", {"comm hidden", CellFormat::kFixed3}},
  };
  std::vector<Json> objects;
  std::set<std::string> present;
  for (const auto& r : rows_in) {
    Json o = flatten_trial(r);
    const Json* p = stored_profile(r);
    o["profile"] = p ? p->value("status", std::string(stored_summary(r) ? "ok" : "none")) : std::string("none");
    if (p) {
      if (p->contains("tool")) o["profile_tool"] = p->at("tool");
      else if (const Json* s = stored_summary(r)) o["profile_tool"] = s->value("source", "");
      if (p->contains("reason")) o["profile_reason"] = p->at("reason");
      if (p->contains("ranks") && p->at("ranks").is_array()) o["profile_ranks"] = p->at("ranks").size();
    }
    if (const Json* s = stored_summary(r)) {
      Json derived = s->value("derived", Json::object());
      // nsys: the bytes copied host to device (cuda_gpu_mem_size_sum, in MB as nsys prints them)
      // and the copies' bandwidth — what pinned memory changes.
      if (s->contains("tables") && s->at("tables").is_array()) {
        for (const auto& tb : s->at("tables")) {
          if (!tb.is_object() || tb.value("id", "") != "cuda_gpu_mem_size_sum" || tb.value("unit", "") != "MB") continue;
          double mb = 0;
          for (const auto& row : tb.value("rows", Json::array())) {
            const std::string name = row.value("name", "");
            if (name.find("Host-to-Device") != std::string::npos || name.find("HtoD") != std::string::npos)
              mb += row.value("total", 0.0);
          }
          derived["memcpy_htod_mb"] = mb;
          const double secs = derived.value("memcpy_htod_s", 0.0);
          if (secs > 0) derived["memcpy_htod_gb_per_s"] = mb * 1e-3 / secs;
        }
      }
      for (auto it = derived.begin(); it != derived.end(); ++it) {
        if (!it.value().is_number() || o.contains(it.key())) continue;
        o[it.key()] = it.value();
        present.insert(it.key());
      }
    }
    objects.push_back(std::move(o));
  }
  objects = apply_filters(objects, filters);
  std::set<std::int64_t> ids;
  for (const auto& o : objects) ids.insert(o["trial_id"].get<std::int64_t>());
  std::vector<TrialRow> kept;
  for (const auto& r : rows_in)
    if (ids.count(r.trial_id)) kept.push_back(r);

  Table t;
  if (with_sweep) t.columns.push_back({"sweep", "sweep"});
  t.columns.push_back({"trial_id", "trial", CellFormat::kInt});
  t.columns.push_back({"status", "status"});
  for (const auto& p : varying_params(kept, param_order)) t.columns.push_back({p, p});
  t.columns.push_back({"tokens_per_s_per_device", "tokens/s/device", CellFormat::kFixed1});
  t.columns.push_back({"profile", "profile"});
  if (std::any_of(objects.begin(), objects.end(), [](const Json& o) { return o.contains("profile_ranks"); }))
    t.columns.push_back({"profile_ranks", "reports", CellFormat::kInt});
  for (const auto& [key, how] : known)
    if (present.count(key)) t.columns.push_back({key, how.first, how.second});
  for (const auto& key : present) {
    const bool listed = std::any_of(known.begin(), known.end(), [&](const auto& k) { return k.first == key; });
    if (!listed) t.columns.push_back({key, key, CellFormat::kSig4});
  }
  const bool any_reason = std::any_of(objects.begin(), objects.end(), [](const Json& o) { return o.contains("profile_reason"); });
  if (any_reason) t.columns.push_back({"profile_reason", "profile note"});
  t.rows = std::move(objects);
  const auto count = [&](const char* status) {
    return std::count_if(t.rows.begin(), t.rows.end(), [&](const Json& o) { return o.value("profile", "") == status; });
  };
  if (const auto n = count("none"); n > 0) {
    t.notes.push_back(std::to_string(n) + " trial(s) without a profile (native: run with --profile; external: "
                      "[workload] profile = \"nsys\" or \"torch\")");
  }
  if (const auto n = count("failed"); n > 0) {
    t.notes.push_back(std::to_string(n) + " trial(s) whose profile failed (the reason is in the profile note; the "
                      "trial itself is recorded as it ended)");
  }
  t.notes.push_back("seconds are totals over the profiled run: over every process in one report (nsys around "
                    "torchrun), rank 0's where each rank wrote a report (\"reports\" > 1); `--format json` has every "
                    "figure");
  return t;
}

Table telemetry_table(const std::vector<TelemetrySample>& samples) {
  Table t;
  t.columns = {{"trial_id", "trial", CellFormat::kInt}, {"t_s", "t s", CellFormat::kFixed3}, {"source", "source"},
               {"device", "device"}, {"metric", "metric"}, {"value", "value", CellFormat::kFixed3}};
  for (const auto& s : samples) {
    t.rows.push_back({{"trial_id", s.trial_id}, {"t_s", s.t_s}, {"source", s.source}, {"device", s.device},
                      {"metric", s.metric}, {"value", s.value}});
  }
  return t;
}

Table memory_table(const std::vector<TrialRow>& rows_in, const std::vector<Filter>& filters,
                   const std::vector<std::string>& param_order) {
  std::vector<Json> objects;
  for (const auto& r : rows_in) objects.push_back(flatten_trial(r));
  objects = apply_filters(objects, filters);

  // The parts in the plan's own display order (train/memory_plan.cpp), then any other the engine
  // names (a method's own part, e.g. a reference model), alphabetically. "allocator rounding" is
  // already inside the other parts.
  static const std::vector<std::string> kOrder = {
      "weights",          "gradients",      "optimizer_states", "reference_model",    "batch",
      "activations",      "attention_scores", "logits",         "fused_loss_chunk",   "head_buffers",
      "recomputed_layer", "backward_temporaries", "workspace",  "other",              "allocator_cache"};
  std::set<std::string> present;
  for (const auto& o : objects)
    for (auto it = o.begin(); it != o.end(); ++it) {
      const std::string& k = it.key();
      if (k.size() > 11 && k.rfind("plan_", 0) == 0 && k.compare(k.size() - 6, 6, "_bytes") == 0 &&
          k != "plan_total_bytes" && k != "plan_allocator_rounding_bytes" && it->is_number() && it->get<double>() > 0)
        present.insert(k.substr(5, k.size() - 11));
    }
  std::vector<std::string> parts;
  for (const auto& p : kOrder)
    if (present.erase(p)) parts.push_back(p);
  for (const auto& p : present) parts.push_back(p);

  constexpr double kGiB = 1024.0 * 1024 * 1024;
  int with_plan = 0, matching = 0;
  for (auto& o : objects) {
    for (const auto& p : parts) {
      auto it = o.find("plan_" + p + "_bytes");
      if (it != o.end() && it->is_number()) o["plan_" + p + "_gib"] = it->get<double>() / kGiB;
    }
    // A trial that did not finish (out of memory, ...) has no step time or throughput; its plan
    // and what it held when it stopped still say why.
    if (o.value("status", std::string()) != "ok") {
      o.erase("step_time_s");
      o.erase("tokens_per_s_per_device");
    }
    if (o.contains("plan_total_bytes") && o["plan_total_bytes"].is_number()) {
      o["plan_gib"] = o["plan_total_bytes"].get<double>() / kGiB;
      if (o.value("status", std::string()) == "ok" && o.contains("max_reserved_bytes") &&
          o["max_reserved_bytes"].is_number()) {
        ++with_plan;
        if (o["plan_total_bytes"].get<double>() == o["max_reserved_bytes"].get<double>()) ++matching;
      }
    }
  }

  Table t;
  t.columns = {{"trial_id", "trial", CellFormat::kInt}, {"status", "status"}};
  for (const auto& p : varying_params(rows_in, param_order)) t.columns.push_back({p, p});
  t.columns.push_back({"trainable_params", "trainable params", CellFormat::kInt});
  t.columns.push_back({"step_time_s", "step s", CellFormat::kFixed3});
  t.columns.push_back({"tokens_per_s_per_device", "tokens/s/device", CellFormat::kFixed1});
  t.columns.push_back({"val_loss", "val loss", CellFormat::kFixed4});
  t.columns.push_back({"memory_gib", "measured peak GiB", CellFormat::kFixed3});
  t.columns.push_back({"plan_gib", "planned peak GiB", CellFormat::kFixed3});
  for (const auto& p : parts) {
    std::string label = p;
    std::replace(label.begin(), label.end(), '_', ' ');
    t.columns.push_back({"plan_" + p + "_gib", label + " GiB", CellFormat::kFixed3});
  }
  t.rows = std::move(objects);
  if (t.rows.empty()) {
    t.notes.push_back("No trials match.");
  } else if (parts.empty()) {
    t.notes.push_back("No trial has a memory plan in its run record (native `scalelab train` trials record one).");
  } else {
    t.notes.push_back("The parts are what each held at the planned peak (the engine's plan on the meta device). "
                      "Planned peak equals the measured one in " + std::to_string(matching) + " of " +
                      std::to_string(with_plan) + " trials that finished.");
  }
  return t;
}

}  // namespace scalelab::lab
