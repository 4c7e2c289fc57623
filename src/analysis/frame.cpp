#include "analysis/frame.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "lab/store.h"
#include "lab/views.h"

namespace scalelab::analysis {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::optional<double> number_of(const Json& v) {
  if (v.is_number()) return v.get<double>();
  return std::nullopt;
}

bool is_power_of_two(double v) {
  if (!(v >= 1) || v != std::floor(v) || v > 9.007199254740992e15) return false;
  auto u = static_cast<unsigned long long>(v);
  return (u & (u - 1)) == 0;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double sd1_of(const std::vector<double>& v) {
  if (v.size() < 2) return kNaN;
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

// numpy.percentile's default (linear interpolation between closest ranks).
double percentile_linear(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  auto lo = static_cast<std::size_t>(std::floor(pos));
  std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// A CSV cell as a JSON scalar: numbers, true/false, missing markers -> null, else text.
Json parse_cell(const std::string& raw) {
  std::string s = raw;
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && s[b] == ' ') ++b;
  s = s.substr(b);
  if (s.empty() || s == "nan" || s == "NaN" || s == "NA" || s == "null") return Json();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size()) {
    if (std::isnan(d)) return Json();
    return d;
  }
  return s;
}

// RFC 4180 records: quoted fields may hold commas, quotes ("") and newlines.
std::vector<std::vector<std::string>> read_csv_records(const std::string& text, std::vector<int>& lines) {
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> rec;
  std::string field;
  bool quoted = false, any = false;
  int line = 1, rec_line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') { field += '"'; ++i; }
        else quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (c == '"') { quoted = true; any = true; }
    else if (c == ',') { rec.push_back(field); field.clear(); any = true; }
    else if (c == '\n') {
      if (any || !field.empty()) { rec.push_back(field); out.push_back(rec); lines.push_back(rec_line); }
      rec.clear(); field.clear(); any = false;
      rec_line = ++line;
    } else if (c != '\r') { field += c; any = true; }
  }
  if (quoted) throw InvalidInput("[analyze] CSV: a quoted field opened on line " + std::to_string(rec_line) + " never closes — close the quote");
  if (any || !field.empty()) { rec.push_back(field); out.push_back(rec); lines.push_back(rec_line); }
  return out;
}

void make_unique_names(Frame& f) {
  std::map<std::string, int> seen;
  for (auto& c : f.columns) {
    int n = ++seen[c.name];
    if (n > 1) c.name += "_" + std::to_string(n);
  }
}

}  // namespace

const char* kind_name(ColumnKind k) {
  switch (k) {
    case ColumnKind::kNumeric: return "numeric";
    case ColumnKind::kBinary: return "binary";
    case ColumnKind::kCategorical: return "categorical";
  }
  return "?";
}

const char* role_name(ColumnRole r) {
  switch (r) {
    case ColumnRole::kParameter: return "parameter";
    case ColumnRole::kOutcome: return "outcome";
    case ColumnRole::kTelemetry: return "telemetry";
    case ColumnRole::kScaling: return "scaling";
    case ColumnRole::kOther: return "other";
  }
  return "?";
}

std::string sanitize_name(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    bool ok = std::isalnum(c) || c == '_' || c == '.' || c == '=' || c == '-';
    out += ok ? static_cast<char>(c) : '_';
  }
  if (out.empty()) out = "_";
  return out;
}

const Column* Frame::find(const std::string& name) const {
  for (const auto& c : columns)
    if (c.name == name || c.source == name) return &c;
  return nullptr;
}

Column type_column(const std::string& name, const std::vector<Json>& cells, ColumnRole role) {
  Column c;
  c.name = sanitize_name(name);
  c.source = name;
  c.role = role;
  bool all_numeric = true, all_bool = true;
  std::set<std::string> levels;
  for (const auto& v : cells) {
    if (v.is_null()) continue;
    if (!v.is_number()) all_numeric = false;
    if (!v.is_boolean()) all_bool = false;
  }
  const std::size_t n = cells.size();
  c.values.assign(n, kNaN);
  c.spread.assign(n, kNaN);
  if (all_numeric) {
    c.kind = ColumnKind::kNumeric;
    std::set<double> distinct;
    bool pow2 = true;
    for (std::size_t i = 0; i < n; ++i)
      if (auto d = number_of(cells[i])) {
        c.values[i] = *d;
        distinct.insert(*d);
        if (!is_power_of_two(*d)) pow2 = false;
      }
    c.log2_axis = pow2 && distinct.size() >= 3;
    return c;
  }
  c.text.assign(n, "");
  for (std::size_t i = 0; i < n; ++i) {
    const Json& v = cells[i];
    if (v.is_null()) continue;
    std::string t = v.is_string() ? v.get<std::string>() : (v.is_boolean() ? (v.get<bool>() ? "true" : "false") : v.dump());
    c.text[i] = t;
    levels.insert(t);
  }
  c.levels.assign(levels.begin(), levels.end());
  if (all_bool) c.levels = {"false", "true"};
  c.kind = (all_bool || c.levels.size() == 2) ? ColumnKind::kBinary : ColumnKind::kCategorical;
  if (c.kind == ColumnKind::kBinary) {
    for (std::size_t i = 0; i < n; ++i)
      if (!c.text[i].empty()) c.values[i] = c.text[i] == c.levels[1] ? 1.0 : 0.0;
  }
  return c;
}

void drop_constant_columns(Frame& frame) {
  std::vector<Column> kept;
  for (auto& c : frame.columns) {
    std::set<std::string> distinct;
    for (std::size_t i = 0; i < frame.rows(); ++i) {
      if (c.kind == ColumnKind::kNumeric) {
        if (!std::isnan(c.values[i])) {
          std::ostringstream o;
          o.precision(17);
          o << c.values[i];
          distinct.insert(o.str());
        }
      } else if (!c.text[i].empty()) {
        distinct.insert(c.text[i]);
      }
    }
    if (distinct.empty()) frame.dropped_missing.push_back(c.name);
    if (distinct.size() <= 1) frame.dropped_constant.push_back(c.name);
    else kept.push_back(std::move(c));
  }
  frame.columns = std::move(kept);
}

Json Frame::to_json() const {
  Json cols = Json::array();
  for (const auto& c : columns) {
    Json vals = Json::array();
    for (std::size_t i = 0; i < rows(); ++i) {
      if (c.kind == ColumnKind::kCategorical) vals.push_back(c.text[i].empty() ? Json() : Json(c.text[i]));
      else if (c.kind == ColumnKind::kBinary) vals.push_back(c.text[i].empty() ? Json() : Json(c.text[i]));
      else vals.push_back(std::isnan(c.values[i]) ? Json() : Json(c.values[i]));
    }
    Json j{{"name", c.name}, {"source", c.source}, {"kind", kind_name(c.kind)}, {"role", role_name(c.role)},
           {"values", vals}, {"log2_axis", c.log2_axis}};
    if (!c.levels.empty()) j["levels"] = c.levels;
    bool any_spread = std::any_of(c.spread.begin(), c.spread.end(), [](double s) { return !std::isnan(s); });
    if (any_spread) {
      Json sp = Json::array();
      for (double s : c.spread) sp.push_back(std::isnan(s) ? Json() : Json(s));
      j["repeat_sd"] = sp;
    }
    cols.push_back(j);
  }
  return {{"source", source}, {"rows", rows()}, {"row_labels", row_labels}, {"repeats", repeats},
          {"columns", cols}, {"dropped_constant", dropped_constant}, {"dropped_missing", dropped_missing}, {"notes", notes}};
}

Frame build_frame_from_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput("[analyze] cannot read the CSV file '" + path + "' — check the path (--csv)");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int> lines;
  auto recs = read_csv_records(ss.str(), lines);
  if (recs.empty()) throw InvalidInput("[analyze] CSV '" + path + "' is empty — it needs a header row and one row per run");
  const auto& header = recs[0];
  if (recs.size() < 2) throw InvalidInput("[analyze] CSV '" + path + "' has a header but no data rows");
  for (std::size_t r = 1; r < recs.size(); ++r)
    if (recs[r].size() != header.size())
      throw InvalidInput("[analyze] CSV '" + path + "' line " + std::to_string(lines[r]) + " has " +
                         std::to_string(recs[r].size()) + " cells, the header has " + std::to_string(header.size()) +
                         " — every row needs one cell per column (leave a cell empty for a missing value)");
  Frame f;
  f.source = "CSV " + path;
  for (std::size_t r = 1; r < recs.size(); ++r) {
    f.row_labels.push_back("row " + std::to_string(r));
    f.repeats.push_back(1);
  }
  for (std::size_t c = 0; c < header.size(); ++c) {
    std::vector<Json> cells;
    for (std::size_t r = 1; r < recs.size(); ++r) cells.push_back(parse_cell(recs[r][c]));
    f.columns.push_back(type_column(header[c].empty() ? "column_" + std::to_string(c + 1) : header[c], cells, ColumnRole::kOther));
  }
  make_unique_names(f);
  drop_constant_columns(f);
  return f;
}

Frame build_frame_from_sweep(const lab::ResultsStore& store, const std::string& sweep_name) {
  auto sweep = store.find_sweep(sweep_name);
  if (!sweep) {
    std::string names;
    for (const auto& s : store.sweeps()) names += (names.empty() ? "" : ", ") + s.name;
    throw InvalidInput("[analyze] no sweep '" + sweep_name + "' in " + store.path() + " — sweeps: " +
                       (names.empty() ? "none" : names));
  }
  // The sweep's configurations: its stored membership, so an [oom_search]'s probes (trials of the
  // same sweep at other micro-batch sizes) are not rows of the analysis.
  auto trials = lab::member_trials(*sweep, store);
  std::vector<std::string> order;
  std::map<std::string, std::vector<const lab::TrialRow*>> groups;
  int failed = 0;
  for (const auto& t : trials) {
    if (t.status != lab::TrialStatus::kOk) { ++failed; continue; }
    if (!groups.count(t.config_hash)) order.push_back(t.config_hash);
    groups[t.config_hash].push_back(&t);
  }
  if (order.empty())
    throw InvalidInput("[analyze] sweep '" + sweep_name + "' has no successful trial (" + std::to_string(trials.size()) +
                       " trials) — nothing to analyze; see `scalelab results --sweep " + sweep_name + "`");
  Frame f;
  f.source = "sweep " + sweep_name + " (" + store.path() + ")";
  if (failed) f.notes.push_back(std::to_string(failed) + " trial(s) that did not finish ok (oom, error, timeout) are left out");

  // Telemetry per trial: source.metric -> stats over the steady window, pooled over devices.
  auto samples = store.telemetry_samples(0, sweep->sweep_id);
  std::map<std::int64_t, std::map<std::string, std::vector<std::pair<double, double>>>> tel;  // trial -> key -> (t, v)
  for (const auto& s : samples) tel[s.trial_id][s.source + "." + s.metric].push_back({s.t_s, s.value});
  auto telemetry_stats = [&](std::int64_t trial_id) {
    std::map<std::string, double> out;
    auto it = tel.find(trial_id);
    if (it == tel.end()) return out;
    for (const auto& [key, pts] : it->second) {
      double t0 = pts.front().first, t1 = t0;
      for (const auto& p : pts) { t0 = std::min(t0, p.first); t1 = std::max(t1, p.first); }
      double cut = t0 + 0.1 * (t1 - t0);
      std::vector<double> v;
      for (const auto& p : pts)
        if (pts.size() < 10 || p.first >= cut) v.push_back(p.second);
      if (v.empty()) continue;
      out["tel." + key + ".avg"] = mean_of(v);
      out["tel." + key + ".max"] = *std::max_element(v.begin(), v.end());
      out["tel." + key + ".p95"] = percentile_linear(v, 95);
    }
    return out;
  };

  std::vector<std::string> param_keys, metric_keys, tel_keys;
  std::set<std::string> pk, mk, tk;
  struct RowData { lab::ParamMap params; std::map<std::string, std::vector<double>> metrics, tel; };
  std::vector<RowData> rows;
  for (const auto& h : order) {
    RowData rd;
    const auto& g = groups[h];
    rd.params = g.front()->params();
    for (const auto& [k, v] : rd.params) if (pk.insert(k).second) param_keys.push_back(k);
    for (const auto* t : g) {
      for (auto it = t->metrics.begin(); it != t->metrics.end(); ++it) {
        if (!it.value().is_number()) continue;
        // The memory plan's parts (plan_<part>_bytes: `results --view memory`) are a breakdown of
        // one outcome, not outcomes of their own: only the planned total joins the analysis.
        if (it.key().rfind("plan_", 0) == 0 && it.key() != "plan_total_bytes") continue;
        double d = it.value().get<double>();
        if (!std::isfinite(d)) continue;
        rd.metrics[it.key()].push_back(d);
        if (mk.insert(it.key()).second) metric_keys.push_back(it.key());
      }
      for (const auto& [k, v] : telemetry_stats(t->trial_id)) {
        rd.tel[k].push_back(v);
        if (tk.insert(k).second) tel_keys.push_back(k);
      }
    }
    f.row_labels.push_back("trial " + std::to_string(g.front()->trial_id));
    f.repeats.push_back(static_cast<int>(g.size()));
    f.row_trials.emplace_back();
    for (const auto* t : g) f.row_trials.back().push_back(t->trial_id);
    rows.push_back(std::move(rd));
  }
  std::sort(tel_keys.begin(), tel_keys.end());
  for (const auto& k : param_keys) {
    std::vector<Json> cells;
    for (const auto& r : rows) cells.push_back(r.params.count(k) ? r.params.at(k) : Json());
    f.columns.push_back(type_column(k, cells, ColumnRole::kParameter));
  }
  auto add_numeric = [&](const std::string& k, ColumnRole role, auto getter) {
    std::vector<Json> cells;
    std::vector<double> spread;
    for (const auto& r : rows) {
      const std::vector<double>* v = getter(r, k);
      cells.push_back(v && !v->empty() ? Json(mean_of(*v)) : Json());
      spread.push_back(v ? sd1_of(*v) : kNaN);
    }
    Column c = type_column(k, cells, role);
    c.spread = spread;
    f.columns.push_back(std::move(c));
  };
  for (const auto& k : metric_keys)
    add_numeric(k, ColumnRole::kOutcome, [](const RowData& r, const std::string& key) -> const std::vector<double>* {
      auto it = r.metrics.find(key);
      return it == r.metrics.end() ? nullptr : &it->second;
    });
  for (const auto& k : tel_keys)
    add_numeric(k, ColumnRole::kTelemetry, [](const RowData& r, const std::string& key) -> const std::vector<double>* {
      auto it = r.tel.find(key);
      return it == r.tel.end() ? nullptr : &it->second;
    });

  // Scaling against the fewest-ranks row with the same other parameters.
  const bool numeric_ranks = pk.count("ranks") && std::all_of(rows.begin(), rows.end(), [](const RowData& r) {
    return r.params.count("ranks") && r.params.at("ranks").is_number() && r.params.at("ranks").get<double>() > 0;
  });
  if (numeric_ranks) {
    std::map<std::string, std::vector<std::size_t>> same;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      lab::ParamMap p = rows[i].params;
      p.erase("ranks");
      same[Json(p).dump()].push_back(i);
    }
    std::vector<Json> speedup(rows.size()), eff(rows.size()), kf(rows.size());
    bool any = false;
    for (const auto& [key, idx] : same) {
      if (idx.size() < 2) continue;
      auto total = [&](std::size_t i) -> std::optional<double> {
        auto it = rows[i].metrics.find("tokens_per_s");
        if (it != rows[i].metrics.end()) return mean_of(it->second);
        return std::nullopt;
      };
      auto ranks = [&](std::size_t i) { return rows[i].params.at("ranks").get<double>(); };
      std::size_t base = idx.front();
      for (auto i : idx) if (ranks(i) < ranks(base)) base = i;
      auto tb = total(base);
      if (!tb || *tb <= 0) continue;
      for (auto i : idx) {
        auto ti = total(i);
        if (!ti) continue;
        double s = *ti / *tb;
        const double p = ranks(i) / ranks(base);
        speedup[i] = s;
        eff[i] = 100.0 * s / p;
        if (p > 1) kf[i] = (1.0 / s - 1.0 / p) / (1.0 - 1.0 / p);
        any = true;
      }
    }
    if (any) {
      f.columns.push_back(type_column("speedup", speedup, ColumnRole::kScaling));
      f.columns.push_back(type_column("efficiency_pct", eff, ColumnRole::kScaling));
      f.columns.push_back(type_column("karp_flatt", kf, ColumnRole::kScaling));
    }
  }
  make_unique_names(f);
  drop_constant_columns(f);
  return f;
}

}  // namespace scalelab::analysis
