#include "analysis/baseline.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "lab/store.h"

namespace scalelab::analysis {
namespace {

struct Acc {
  std::vector<double> v;
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  }
  double sd() const {
    if (v.size() < 2) return NAN;
    double m = mean(), s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / static_cast<double>(v.size() - 1));
  }
};

// config hash -> metric -> values; config hash -> label.
void collect(const lab::ResultsStore& store, std::int64_t sweep_id, std::map<std::string, std::map<std::string, Acc>>& out,
             std::map<std::string, std::string>& labels, std::vector<std::string>& order, const std::vector<std::string>& varying) {
  for (const auto& t : store.trials(sweep_id)) {
    if (t.status != lab::TrialStatus::kOk) continue;
    if (!labels.count(t.config_hash)) {
      labels[t.config_hash] = lab::params_label(t.params(), varying);
      order.push_back(t.config_hash);
    }
    for (auto it = t.metrics.begin(); it != t.metrics.end(); ++it)
      if (it.value().is_number()) out[t.config_hash][it.key()].v.push_back(it.value().get<double>());
  }
}

Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }

}  // namespace

bool lower_is_better(const std::string& m) {
  for (const char* k : {"loss", "time", "bytes", "gib", "memory"})
    if (m.find(k) != std::string::npos) return true;
  return false;
}

void add_baseline(Analysis& a, const lab::ResultsStore& store, const std::string& sweep, const std::string& baseline,
                  const std::vector<std::string>& targets) {
  auto cur = store.find_sweep(sweep);
  auto base = store.find_sweep(baseline);
  if (!base) throw InvalidInput("[report] --baseline: no sweep '" + baseline + "' in " + store.path() + " — see `scalelab results --db " + store.path() + "`");
  std::map<std::string, std::map<std::string, Acc>> c, b;
  std::map<std::string, std::string> lc, lb;
  std::vector<std::string> oc, ob;
  // Labels name the parameters that vary over the two sweeps.
  std::map<std::string, std::set<std::string>> seen;
  for (auto id : {cur->sweep_id, base->sweep_id})
    for (const auto& t : store.trials(id))
      for (const auto& [k, v] : t.params()) seen[k].insert(v.dump());
  std::vector<std::string> varying;
  for (const auto& [k, vals] : seen)
    if (vals.size() > 1) varying.push_back(k);
  collect(store, cur->sweep_id, c, lc, oc, varying);
  collect(store, base->sweep_id, b, lb, ob, varying);
  lab::Table t;
  t.columns = {{"config", "configuration"}, {"target", "target"}, {"baseline_mean", "baseline", lab::CellFormat::kSig4},
               {"current_mean", "current", lab::CellFormat::kSig4}, {"ratio", "ratio", lab::CellFormat::kFixed3},
               {"ratio_low", "95% low", lab::CellFormat::kFixed3}, {"ratio_high", "95% high", lab::CellFormat::kFixed3},
               {"n_baseline", "n base", lab::CellFormat::kInt}, {"n_current", "n cur", lab::CellFormat::kInt}, {"verdict", "verdict"}};
  int regressions = 0, joined = 0;
  for (const auto& h : oc) {
    if (!b.count(h)) continue;
    ++joined;
    for (const auto& tg : targets) {
      if (!c[h].count(tg) || !b[h].count(tg)) continue;
      const Acc& x = c[h][tg];
      const Acc& y = b[h][tg];
      const double mc = x.mean(), mb = y.mean();
      if (!(mb != 0)) continue;
      const double ratio = mc / mb;
      double lo = NAN, hi = NAN;
      if (x.v.size() >= 2 && y.v.size() >= 2 && mc != 0) {
        const double se = std::sqrt(x.sd() * x.sd() / (static_cast<double>(x.v.size()) * mc * mc) +
                                    y.sd() * y.sd() / (static_cast<double>(y.v.size()) * mb * mb));
        lo = ratio * std::exp(-1.96 * se);
        hi = ratio * std::exp(1.96 * se);
      }
      const bool lower_better = lower_is_better(tg);
      bool worse, better;
      if (std::isfinite(lo)) {
        worse = lower_better ? lo > 1 : hi < 1;
        better = lower_better ? hi < 1 : lo > 1;
      } else {
        worse = lower_better ? ratio > 1.05 : ratio < 0.95;
        better = lower_better ? ratio < 0.95 : ratio > 1.05;
      }
      regressions += worse;
      t.rows.push_back({{"config", lc[h]}, {"target", tg}, {"baseline_mean", mb}, {"current_mean", mc}, {"ratio", ratio},
                        {"ratio_low", num(lo)}, {"ratio_high", num(hi)}, {"n_baseline", y.v.size()}, {"n_current", x.v.size()},
                        {"verdict", worse ? "regression" : (better ? "improvement" : "no change")}, {"lower_is_better", lower_better}});
    }
  }
  a.json["baseline"] = {{"sweep", baseline}, {"configurations_joined", joined}, {"regressions", regressions}, {"rows", t.rows}};
  a.tables.push_back({"baseline", t});
  a.markdown += "\n## Against the baseline sweep " + baseline + " (" + std::to_string(joined) + " configurations in both, " +
                std::to_string(regressions) + " regression(s))\n\n" + lab::render_markdown(t);
  if (joined == 0)
    a.json["problems"].push_back("--baseline " + baseline + ": no configuration is in both sweeps (they are joined on the same parameters)");
}

}  // namespace scalelab::analysis
