#include "analysis/correlation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "analysis/special.h"

namespace scalelab::analysis {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }

Correlation pearson_complete(const std::vector<double>& x, const std::vector<double>& y) {
  Correlation c;
  c.n = x.size();
  if (c.n < 3) { c.r = c.p = kNaN; return c; }
  double n = static_cast<double>(c.n), mx = 0, my = 0;
  for (std::size_t i = 0; i < c.n; ++i) { mx += x[i]; my += y[i]; }
  mx /= n;
  my /= n;
  double sxx = 0, syy = 0, sxy = 0;
  for (std::size_t i = 0; i < c.n; ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  if (sxx == 0 || syy == 0) { c.r = c.p = kNaN; return c; }
  c.r = std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
  if (std::fabs(c.r) == 1.0) { c.p = 0; return c; }
  double df = n - 2;
  double t = c.r * std::sqrt(df / (1 - c.r * c.r));
  c.p = t_two_sided_p(t, df);
  return c;
}

void complete_pairs(const std::vector<double>& x, const std::vector<double>& y, std::vector<double>& xs, std::vector<double>& ys) {
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (!std::isnan(x[i]) && !std::isnan(y[i])) { xs.push_back(x[i]); ys.push_back(y[i]); }
}

}  // namespace

std::vector<double> average_ranks(const std::vector<double>& v) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < v.size(); ++i) if (!std::isnan(v[i])) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size(), kNaN);
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    double rank = 0.5 * (static_cast<double>(i) + static_cast<double>(j)) + 1.0;
    for (std::size_t k = i; k <= j; ++k) r[idx[k]] = rank;
    i = j + 1;
  }
  return r;
}

Correlation pearson(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> xs, ys;
  complete_pairs(x, y, xs, ys);
  return pearson_complete(xs, ys);
}

Correlation spearman(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> xs, ys;
  complete_pairs(x, y, xs, ys);
  return pearson_complete(average_ranks(xs), average_ranks(ys));
}

std::vector<Variable> association_variables(const Frame& frame) {
  std::vector<Variable> out;
  for (const auto& c : frame.columns) {
    if (c.kind != ColumnKind::kCategorical) {
      out.push_back({c.name, c.name, c.kind, c.role, c.values});
      continue;
    }
    for (const auto& level : c.levels) {
      std::vector<double> v(frame.rows(), kNaN);
      for (std::size_t i = 0; i < frame.rows(); ++i)
        if (!c.text[i].empty()) v[i] = c.text[i] == level ? 1.0 : 0.0;
      out.push_back({c.name + "=" + level, c.name, ColumnKind::kBinary, c.role, v});
    }
  }
  return out;
}

std::vector<Variable> design_variables(const Frame& frame, const std::vector<std::string>& features) {
  std::vector<Variable> out;
  for (const auto& f : features) {
    const Column* c = frame.find(f);
    if (!c) continue;
    if (c->kind != ColumnKind::kCategorical) {
      out.push_back({c->name, c->name, c->kind, c->role, c->values});
      continue;
    }
    for (std::size_t l = 1; l < c->levels.size(); ++l) {
      std::vector<double> v(frame.rows(), kNaN);
      for (std::size_t i = 0; i < frame.rows(); ++i)
        if (!c->text[i].empty()) v[i] = c->text[i] == c->levels[l] ? 1.0 : 0.0;
      out.push_back({c->name + "=" + c->levels[l], c->name, ColumnKind::kBinary, c->role, v});
    }
  }
  return out;
}

std::vector<std::size_t> cluster_order(const std::vector<std::vector<double>>& dist) {
  const std::size_t n = dist.size();
  std::vector<std::vector<std::size_t>> clusters;
  for (std::size_t i = 0; i < n; ++i) clusters.push_back({i});
  auto linkage = [&](const std::vector<std::size_t>& a, const std::vector<std::size_t>& b) {
    double s = 0;
    for (auto i : a) for (auto j : b) s += dist[i][j];
    return s / static_cast<double>(a.size() * b.size());
  };
  while (clusters.size() > 1) {
    std::size_t bi = 0, bj = 1;
    double best = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < clusters.size(); ++i)
      for (std::size_t j = i + 1; j < clusters.size(); ++j) {
        double d = linkage(clusters[i], clusters[j]);
        if (d < best) { best = d; bi = i; bj = j; }
      }
    clusters[bi].insert(clusters[bi].end(), clusters[bj].begin(), clusters[bj].end());
    clusters.erase(clusters.begin() + static_cast<std::ptrdiff_t>(bj));
  }
  return n ? clusters[0] : std::vector<std::size_t>{};
}

CorrelationMatrix correlation_matrix(const std::vector<Variable>& vars) {
  CorrelationMatrix m;
  const std::size_t k = vars.size();
  for (const auto& v : vars) m.names.push_back(v.name);
  m.pearson.assign(k, std::vector<Correlation>(k));
  m.spearman.assign(k, std::vector<Correlation>(k));
  std::vector<std::vector<double>> dist(k, std::vector<double>(k, 0));
  for (std::size_t i = 0; i < k; ++i)
    for (std::size_t j = i; j < k; ++j) {
      m.pearson[i][j] = m.pearson[j][i] = pearson(vars[i].values, vars[j].values);
      m.spearman[i][j] = m.spearman[j][i] = spearman(vars[i].values, vars[j].values);
      double r = m.pearson[i][j].r;
      dist[i][j] = dist[j][i] = i == j ? 0 : (std::isnan(r) ? 1.0 : 1.0 - std::fabs(r));
    }
  m.clustered_order = cluster_order(dist);
  return m;
}

Json correlation_to_json(const CorrelationMatrix& m) {
  auto grid = [&](const std::vector<std::vector<Correlation>>& g, bool p) {
    Json out = Json::array();
    for (const auto& row : g) {
      Json r = Json::array();
      for (const auto& c : row) r.push_back(num(p ? c.p : c.r));
      out.push_back(r);
    }
    return out;
  };
  Json n = Json::array();
  for (const auto& row : m.pearson) {
    Json r = Json::array();
    for (const auto& c : row) r.push_back(c.n);
    n.push_back(r);
  }
  return {{"variables", m.names},          {"pearson_r", grid(m.pearson, false)}, {"pearson_p", grid(m.pearson, true)},
          {"spearman_rho", grid(m.spearman, false)}, {"spearman_p", grid(m.spearman, true)}, {"n", n},
          {"clustered_order", m.clustered_order}};
}

}  // namespace scalelab::analysis
