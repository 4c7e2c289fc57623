#include "analysis/agreement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "analysis/regression.h"
#include "lab/store.h"
#include "telemetry/summary.h"

namespace scalelab::analysis {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }

struct PairDef {
  const char* quantity;
  const char* src_a;
  const char* met_a;
  const char* src_b;
  const char* met_b;
};
const PairDef kPairs[] = {
    {"memory used", "nvml", "mem_used_bytes", "nvidia-smi", "mem_used_bytes"},
    {"memory used", "nvml", "mem_used_bytes", "engine", "mem_reserved_bytes"},
    {"power", "nvml", "power_w", "nvidia-smi", "power_w"},
    {"GPU utilization", "nvml", "gpu_util_pct", "nvidia-smi", "gpu_util_pct"},
    {"temperature", "nvml", "temperature_c", "nvidia-smi", "temperature_c"},
};

Json stats_json(const AgreementStats& s) {
  return {{"n", s.n}, {"slope", num(s.slope)}, {"intercept", num(s.intercept)}, {"r", num(s.r)}, {"r2", num(s.r2)},
          {"bias", num(s.bias)}, {"sd", num(s.sd)}, {"lower", num(s.lower)}, {"upper", num(s.upper)}, {"ccc", num(s.ccc)}};
}

}  // namespace

AgreementStats agreement_stats(const std::vector<double>& a, const std::vector<double>& b) {
  AgreementStats s;
  s.n = a.size();
  s.slope = s.intercept = s.r = s.r2 = s.bias = s.sd = s.lower = s.upper = s.ccc = kNaN;
  if (s.n == 0) return s;
  const double n = static_cast<double>(s.n);
  double ma = 0, mb = 0, md = 0;
  for (std::size_t i = 0; i < s.n; ++i) { ma += a[i]; mb += b[i]; md += b[i] - a[i]; }
  ma /= n;
  mb /= n;
  md /= n;
  s.bias = md;
  double saa = 0, sbb = 0, sab = 0, sdd = 0;
  for (std::size_t i = 0; i < s.n; ++i) {
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
    sab += (a[i] - ma) * (b[i] - mb);
    double dd = b[i] - a[i] - md;
    sdd += dd * dd;
  }
  if (s.n >= 2) {
    s.sd = std::sqrt(sdd / (n - 1));
    s.lower = s.bias - 1.96 * s.sd;
    s.upper = s.bias + 1.96 * s.sd;
  }
  const double denom = saa / n + sbb / n + (ma - mb) * (ma - mb);
  if (denom > 0) s.ccc = 2 * (sab / n) / denom;
  if (s.n >= 3) {
    LinFit f = linregress("a", a, "b", b);
    if (f.error.empty()) {
      s.slope = f.slope;
      s.intercept = f.intercept;
      s.r = f.r;
      s.r2 = f.r2;
    }
  }
  return s;
}

Json agreement_section(const lab::ResultsStore& store, const std::string& sweep_name, lab::Table& table, std::size_t max_points) {
  table.columns = {{"quantity", "quantity"}, {"a", "a"}, {"b", "b"}, {"level", "level"}, {"n", "n", lab::CellFormat::kInt},
                   {"bias", "bias (b − a)", lab::CellFormat::kSig4}, {"lower", "lower LoA", lab::CellFormat::kSig4},
                   {"upper", "upper LoA", lab::CellFormat::kSig4}, {"ccc", "Lin CCC", lab::CellFormat::kFixed4},
                   {"r", "r", lab::CellFormat::kFixed4}, {"r2", "R²", lab::CellFormat::kFixed4}, {"slope", "slope", lab::CellFormat::kSig4},
                   {"intercept", "intercept", lab::CellFormat::kSig4}};
  Json out = Json::array();
  auto sweep = store.find_sweep(sweep_name);
  if (!sweep) return out;
  // trial -> key -> points (time order)
  std::map<std::int64_t, std::map<SeriesKey, SeriesPoints>> by;
  for (const auto& s : store.telemetry_samples(0, sweep->sweep_id)) {
    auto& p = by[s.trial_id][SeriesKey{s.source, s.device, s.metric}];
    p.t_s.push_back(s.t_s);
    p.value.push_back(s.value);
  }
  for (auto& [tid, m] : by)
    for (auto& [k, p] : m) {
      std::vector<std::size_t> idx(p.t_s.size());
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      // A named reference, not the binding: clang before 16 (make sanitize) cannot capture a
      // structured binding in a lambda.
      const std::vector<double>& t_s = p.t_s;
      std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) { return t_s[x] < t_s[y]; });
      SeriesPoints q;
      for (auto i : idx) { q.t_s.push_back(p.t_s[i]); q.value.push_back(p.value[i]); }
      p = q;
    }
  std::set<std::int64_t> ok;
  for (const auto& t : store.trials(sweep->sweep_id))
    if (t.status == lab::TrialStatus::kOk) ok.insert(t.trial_id);
  for (const auto& def : kPairs) {
    std::vector<double> a, b, ta, tb;
    for (const auto& [tid, m] : by) {
      if (!ok.count(tid)) continue;
      for (const auto& [k, pa] : m) {
        if (k.source != def.src_a || k.metric != def.met_a) continue;
        auto it = m.find(SeriesKey{def.src_b, k.device, def.met_b});
        if (it == m.end()) continue;
        auto pairs = align_nearest(pa, it->second, 0.25);
        if (pairs.empty()) continue;
        double sa = 0, sb = 0;
        for (const auto& [x, y] : pairs) { a.push_back(x); b.push_back(y); sa += x; sb += y; }
        ta.push_back(sa / static_cast<double>(pairs.size()));
        tb.push_back(sb / static_cast<double>(pairs.size()));
      }
    }
    if (a.empty()) continue;
    AgreementStats ps = agreement_stats(a, b), ts = agreement_stats(ta, tb);
    const std::string an = std::string(def.src_a) + "." + def.met_a, bn = std::string(def.src_b) + "." + def.met_b;
    Json pts = Json::array();
    const std::size_t stride = std::max<std::size_t>(1, (a.size() + max_points - 1) / max_points);
    for (std::size_t i = 0; i < a.size(); i += stride) pts.push_back({a[i], b[i]});
    out.push_back({{"quantity", def.quantity}, {"a", an}, {"b", bn}, {"per_sample", stats_json(ps)}, {"per_trial", stats_json(ts)}, {"points", pts}});
    for (const auto& [level, st] : {std::pair<const char*, const AgreementStats*>{"per sample", &ps}, {"per trial", &ts}}) {
      Json row = stats_json(*st);
      row.update({{"quantity", def.quantity}, {"a", an}, {"b", bn}, {"level", level}});
      table.rows.push_back(row);
    }
  }
  return out;
}

void add_agreement(Analysis& a, const lab::ResultsStore& store, const std::string& sweep) {
  lab::Table t;
  a.json["agreement"] = agreement_section(store, sweep, t);
  a.tables.push_back({"agreement", t});
  if (!t.rows.empty()) a.markdown += "\n## Agreement of telemetry sources (Bland–Altman: b − a)\n\n" + lab::render_markdown(t);
}

}  // namespace scalelab::analysis
