#include "analysis/pairs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "analysis/special.h"

namespace scalelab::analysis {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(const std::optional<double>& v) { return v && std::isfinite(*v) ? Json(*v) : Json(); }
}  // namespace

std::vector<double> benjamini_hochberg(const std::vector<double>& p) {
  const std::size_t m = p.size();
  std::vector<std::size_t> idx(m);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
  std::vector<double> q(m);
  double running = 1.0;
  for (std::size_t k = m; k-- > 0;) {
    double v = p[idx[k]] * static_cast<double>(m) / static_cast<double>(k + 1);
    running = std::min(running, v);
    q[idx[k]] = std::min(1.0, running);
  }
  return q;
}

double best_f1(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> thresholds = x;
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  double best = 0;
  for (double t : thresholds)
    for (int dir = 0; dir < 2; ++dir) {
      double tp = 0, fp = 0, fn = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        bool pred = dir == 0 ? x[i] >= t : x[i] <= t;
        bool pos = y[i] == 1.0;
        tp += pred && pos;
        fp += pred && !pos;
        fn += !pred && pos;
      }
      double denom = 2 * tp + fp + fn;
      if (denom > 0) best = std::max(best, 2 * tp / denom);
    }
  return best;
}

double auc(const std::vector<double>& x, const std::vector<double>& y) {
  auto ranks = average_ranks(x);
  double n1 = 0, n0 = 0, s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 1.0) { n1 += 1; s += ranks[i]; }
    else n0 += 1;
  }
  if (n1 == 0 || n0 == 0) return kNaN;
  return (s - n1 * (n1 + 1) / 2) / (n1 * n0);
}

std::vector<PairStat> ranked_pairs(const Frame& frame, const std::vector<Variable>& vars) {
  std::vector<PairStat> out;
  for (std::size_t i = 0; i < vars.size(); ++i)
    for (std::size_t j = i + 1; j < vars.size(); ++j) {
      const Variable& a = vars[i];
      const Variable& b = vars[j];
      const bool an = a.kind == ColumnKind::kNumeric, bn = b.kind == ColumnKind::kNumeric;
      if (!an && !bn) continue;  // binary x binary: categorical pairs below
      const Variable& num_v = an ? a : b;
      const Variable& other = an ? b : a;
      PairStat s;
      s.a = num_v.name;
      s.b = other.name;
      Correlation c = pearson(num_v.values, other.values);
      s.n = c.n;
      if (std::isnan(c.r)) continue;
      s.r = c.r;
      s.p = c.p;
      s.effect = std::fabs(c.r);
      s.sign = c.r > 0 ? 1 : (c.r < 0 ? -1 : 0);
      if (an && bn) {
        s.kind = "numeric-numeric";
        s.rho = spearman(a.values, b.values).r;
      } else {
        s.kind = "numeric-binary";
        s.eta2 = c.r * c.r;
        std::vector<double> xs, ys;
        for (std::size_t k = 0; k < num_v.values.size(); ++k)
          if (!std::isnan(num_v.values[k]) && !std::isnan(other.values[k])) {
            xs.push_back(num_v.values[k]);
            ys.push_back(other.values[k]);
          }
        s.f1 = best_f1(xs, ys);
        s.auc = auc(xs, ys);
      }
      out.push_back(s);
    }
  // Categorical pairs over whole columns.
  std::vector<const Column*> cats;
  for (const auto& c : frame.columns)
    if (c.kind != ColumnKind::kNumeric) cats.push_back(&c);
  for (std::size_t i = 0; i < cats.size(); ++i)
    for (std::size_t j = i + 1; j < cats.size(); ++j) {
      const Column& a = *cats[i];
      const Column& b = *cats[j];
      std::map<std::string, std::size_t> la, lb;
      for (std::size_t k = 0; k < a.levels.size(); ++k) la[a.levels[k]] = k;
      for (std::size_t k = 0; k < b.levels.size(); ++k) lb[b.levels[k]] = k;
      std::vector<std::vector<double>> obs(a.levels.size(), std::vector<double>(b.levels.size(), 0));
      double n = 0;
      for (std::size_t r = 0; r < frame.rows(); ++r) {
        if (a.text[r].empty() || b.text[r].empty()) continue;
        obs[la[a.text[r]]][lb[b.text[r]]] += 1;
        n += 1;
      }
      // Levels absent among the complete rows do not count.
      std::vector<double> rs(obs.size(), 0), cs(obs[0].size(), 0);
      for (std::size_t x = 0; x < obs.size(); ++x)
        for (std::size_t y = 0; y < cs.size(); ++y) { rs[x] += obs[x][y]; cs[y] += obs[x][y]; }
      std::size_t nr = static_cast<std::size_t>(std::count_if(rs.begin(), rs.end(), [](double v) { return v > 0; }));
      std::size_t nc = static_cast<std::size_t>(std::count_if(cs.begin(), cs.end(), [](double v) { return v > 0; }));
      if (nr < 2 || nc < 2) continue;
      double chi2 = 0;
      for (std::size_t x = 0; x < obs.size(); ++x)
        for (std::size_t y = 0; y < cs.size(); ++y) {
          if (rs[x] == 0 || cs[y] == 0) continue;
          double e = rs[x] * cs[y] / n;
          chi2 += (obs[x][y] - e) * (obs[x][y] - e) / e;
        }
      PairStat s;
      s.a = a.name;
      s.b = b.name;
      s.kind = "categorical-categorical";
      s.n = static_cast<std::size_t>(n);
      s.chi2 = chi2;
      s.cramers_v = std::sqrt(chi2 / (n * static_cast<double>(std::min(nr, nc) - 1)));
      s.effect = std::min(1.0, *s.cramers_v);
      s.p = chi2_upper_p(chi2, static_cast<double>((nr - 1) * (nc - 1)));
      out.push_back(s);
    }
  std::vector<double> ps;
  for (const auto& s : out) ps.push_back(s.p);
  auto qs = benjamini_hochberg(ps);
  for (std::size_t k = 0; k < out.size(); ++k) out[k].q = qs[k];
  std::stable_sort(out.begin(), out.end(), [](const PairStat& x, const PairStat& y) {
    if (x.effect != y.effect) return x.effect > y.effect;
    return x.p < y.p;
  });
  return out;
}

Json pair_to_json(const PairStat& s) {
  return {{"a", s.a}, {"b", s.b}, {"kind", s.kind}, {"n", s.n}, {"effect", s.effect}, {"sign", s.sign},
          {"p", num(s.p)}, {"q", num(s.q)}, {"r", num(s.r)}, {"rho", num(s.rho)}, {"eta2", num(s.eta2)},
          {"f1", num(s.f1)}, {"auc", num(s.auc)}, {"cramers_v", num(s.cramers_v)}, {"chi2", num(s.chi2)}};
}

}  // namespace scalelab::analysis
