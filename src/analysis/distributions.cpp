#include "analysis/distributions.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "analysis/correlation.h"
#include "analysis/descriptive.h"
#include "analysis/special.h"

namespace scalelab::analysis {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }
}  // namespace

Histogram histogram(const std::vector<double>& values, int bins) {
  Histogram h;
  std::vector<double> v;
  for (double x : values) if (!std::isnan(x)) v.push_back(x);
  if (v.empty() || bins < 1) return h;
  double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  if (lo == hi) { lo -= 0.5; hi += 0.5; }
  // numpy: edges = linspace(lo, hi, bins + 1); index = floor((x - lo) * bins / (hi - lo)), then
  // corrected against the edges so that a value on an edge lands where the edges say.
  h.edges.resize(static_cast<std::size_t>(bins) + 1);
  const double step = (hi - lo) / bins;
  for (int k = 0; k <= bins; ++k) h.edges[static_cast<std::size_t>(k)] = k == bins ? hi : lo + k * step;
  h.counts.assign(static_cast<std::size_t>(bins), 0);
  const double norm = bins / (hi - lo);
  for (double x : v) {
    auto i = static_cast<long>((x - lo) * norm);
    if (i == bins) i = bins - 1;
    if (x < h.edges[static_cast<std::size_t>(i)]) --i;
    else if (i != bins - 1 && x >= h.edges[static_cast<std::size_t>(i) + 1]) ++i;
    ++h.counts[static_cast<std::size_t>(i)];
  }
  return h;
}

std::vector<long> histogram_counts(const std::vector<double>& values, const std::vector<double>& edges) {
  if (edges.size() < 2) return {};
  std::vector<long> counts(edges.size() - 1, 0);
  for (double x : values) {
    if (std::isnan(x) || x < edges.front() || x > edges.back()) continue;
    if (x == edges.back()) { ++counts.back(); continue; }
    auto k = static_cast<std::size_t>(std::upper_bound(edges.begin(), edges.end(), x) - edges.begin()) - 1;
    ++counts[k];
  }
  return counts;
}

Ecdf ecdf(const std::vector<double>& values) {
  Ecdf e;
  std::vector<double> v;
  for (double x : values) if (!std::isnan(x)) v.push_back(x);
  std::sort(v.begin(), v.end());
  const double n = static_cast<double>(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i + 1 < v.size() && v[i + 1] == v[i]) continue;
    e.x.push_back(v[i]);
    e.f.push_back(static_cast<double>(i + 1) / n);
  }
  return e;
}

GroupTest group_test(const std::string& group_name, const std::vector<std::string>& group,
                     const std::string& value_name, const std::vector<double>& value, int bins) {
  GroupTest g;
  g.group = group_name;
  g.value = value_name;
  g.eta2 = g.f = g.f_p = g.h = g.h_p = kNaN;
  std::map<std::string, std::vector<double>> by;
  std::vector<double> all;
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < group.size(); ++i)
    if (!group[i].empty() && !std::isnan(value[i])) {
      by[group[i]].push_back(value[i]);
      all.push_back(value[i]);
      labels.push_back(group[i]);
    }
  g.n = all.size();
  g.k = by.size();
  for (const auto& [l, v] : by) {
    g.levels.push_back(l);
    g.sizes.push_back(v.size());
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    g.box.push_back({sorted.front(), quantile_sorted(sorted, 0.25), quantile_sorted(sorted, 0.5), quantile_sorted(sorted, 0.75), sorted.back()});
    const double q1 = g.box.back()[1], q3 = g.box.back()[3];
    const double lo = q1 - 1.5 * (q3 - q1), hi = q3 + 1.5 * (q3 - q1);
    std::array<double, 2> w{kNaN, kNaN};
    std::vector<double> out;
    for (double x : sorted) {
      if (x < lo || x > hi) { out.push_back(x); continue; }
      if (std::isnan(w[0])) w[0] = x;
      w[1] = x;
    }
    g.whiskers.push_back(w);
    g.outliers.push_back(out);
    g.ecdfs.push_back(ecdf(v));
    double s = 0;
    for (double x : v) s += x;
    g.means.push_back(s / static_cast<double>(v.size()));
  }
  if (!all.empty()) {
    g.edges = histogram(all, bins).edges;
    for (const auto& [l, v] : by) g.counts.push_back(histogram_counts(v, g.edges));
  }
  if (g.k < 2 || g.n <= g.k) { g.error = "needs at least 2 groups and more values than groups"; return g; }
  const double N = static_cast<double>(g.n), K = static_cast<double>(g.k);
  double grand = 0;
  for (double x : all) grand += x;
  grand /= N;
  double sst = 0, ssb = 0;
  for (double x : all) sst += (x - grand) * (x - grand);
  for (std::size_t k = 0; k < g.k; ++k) ssb += static_cast<double>(g.sizes[k]) * (g.means[k] - grand) * (g.means[k] - grand);
  const double ssw = sst - ssb;
  if (sst > 0) {
    g.eta2 = ssb / sst;
    g.f = (ssb / (K - 1)) / (ssw / (N - K));
    g.f_p = f_upper_p(g.f, K - 1, N - K);
  }
  auto ranks = average_ranks(all);
  std::map<std::string, double> rank_sum;
  for (std::size_t i = 0; i < all.size(); ++i) rank_sum[labels[i]] += ranks[i];
  double h = 0;
  for (std::size_t k = 0; k < g.k; ++k) h += rank_sum[g.levels[k]] * rank_sum[g.levels[k]] / static_cast<double>(g.sizes[k]);
  h = 12.0 / (N * (N + 1)) * h - 3 * (N + 1);
  std::vector<double> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  double ties = 0;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    double t = static_cast<double>(j - i);
    ties += t * t * t - t;
    i = j;
  }
  double corr = 1 - ties / (N * N * N - N);
  if (corr > 0) {
    g.h = h / corr;
    g.h_p = chi2_upper_p(g.h, K - 1);
  }
  return g;
}

Json group_test_to_json(const GroupTest& g) {
  Json means = Json::array();
  for (double m : g.means) means.push_back(num(m));
  Json box = Json::array();
  for (const auto& b : g.box) box.push_back({{"min", b[0]}, {"q25", b[1]}, {"median", b[2]}, {"q75", b[3]}, {"max", b[4]}});
  for (std::size_t k = 0; k < g.box.size(); ++k) {
    box[k]["whisker_low"] = g.whiskers[k][0];
    box[k]["whisker_high"] = g.whiskers[k][1];
    box[k]["outliers"] = g.outliers[k];
  }
  Json levels = Json::array();
  for (std::size_t k = 0; k < g.counts.size(); ++k)
    levels.push_back({{"level", g.levels[k]}, {"counts", g.counts[k]}, {"ecdf", {{"x", g.ecdfs[k].x}, {"f", g.ecdfs[k].f}}}});
  Json j{{"group", g.group}, {"value", g.value}, {"n", g.n}, {"k", g.k}, {"levels", g.levels}, {"sizes", g.sizes}, {"means", means}, {"box", box},
         {"histogram", {{"edges", g.edges}, {"levels", levels}}}};
  if (!g.error.empty()) { j["error"] = g.error; return j; }
  j.update({{"eta2", num(g.eta2)}, {"f", num(g.f)}, {"f_p", num(g.f_p)}, {"kruskal_h", num(g.h)}, {"kruskal_p", num(g.h_p)}});
  return j;
}

}  // namespace scalelab::analysis
