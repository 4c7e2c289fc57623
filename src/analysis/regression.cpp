#include "analysis/regression.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Dense>

#include "analysis/special.h"

namespace scalelab::analysis {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }
Json num(const std::optional<double>& v) { return v ? num(*v) : Json(); }

double sd1(const Eigen::VectorXd& v) {
  double m = v.mean();
  return std::sqrt((v.array() - m).square().sum() / static_cast<double>(v.size() - 1));
}

// R^2 (centered) of y on X (X holds the intercept).
double r2_of(const Eigen::MatrixXd& X, const Eigen::VectorXd& y) {
  Eigen::VectorXd b = X.householderQr().solve(y);
  double rss = (y - X * b).squaredNorm();
  double tss = (y.array() - y.mean()).square().sum();
  return tss > 0 ? 1 - rss / tss : kNaN;
}
}  // namespace

OlsResult ols(const std::string& target, const std::vector<double>& y, const std::vector<Variable>& design) {
  OlsResult r;
  r.target = target;
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < y.size(); ++i) {
    bool ok = !std::isnan(y[i]);
    for (const auto& v : design) ok = ok && !std::isnan(v.values[i]);
    if (ok) rows.push_back(i);
  }
  r.n = rows.size();
  const auto n = static_cast<Eigen::Index>(rows.size());
  Eigen::VectorXd Y(n);
  for (Eigen::Index i = 0; i < n; ++i) Y(i) = y[rows[static_cast<std::size_t>(i)]];
  // Kept columns, greedily.
  std::vector<Eigen::VectorXd> cols{Eigen::VectorXd::Ones(n)};
  std::vector<std::string> names{"const"};
  for (const auto& v : design) {
    Eigen::VectorXd c(n);
    for (Eigen::Index i = 0; i < n; ++i) c(i) = v.values[rows[static_cast<std::size_t>(i)]];
    Eigen::MatrixXd K(n, static_cast<Eigen::Index>(cols.size()));
    for (std::size_t k = 0; k < cols.size(); ++k) K.col(static_cast<Eigen::Index>(k)) = cols[k];
    double norm = c.norm();
    double resid = n > 0 ? (c - K * K.colPivHouseholderQr().solve(c)).norm() : 0;
    if (norm == 0 || resid <= 1e-9 * norm) { r.aliased.push_back(v.name); continue; }
    cols.push_back(c);
    names.push_back(v.name);
  }
  const auto p = static_cast<Eigen::Index>(cols.size());
  r.p = cols.size();
  r.df_resid = static_cast<double>(n - p);
  if (n - p < 1) {
    r.error = "not enough rows: " + std::to_string(n) + " complete rows for " + std::to_string(p) +
              " coefficients (intercept included) — OLS needs more rows than coefficients";
    return r;
  }
  Eigen::MatrixXd X(n, p);
  for (Eigen::Index k = 0; k < p; ++k) X.col(k) = cols[static_cast<std::size_t>(k)];
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(X);
  Eigen::VectorXd beta = qr.solve(Y);
  Eigen::MatrixXd R = qr.matrixQR().topLeftCorner(p, p).triangularView<Eigen::Upper>();
  Eigen::MatrixXd Rinv = R.triangularView<Eigen::Upper>().solve(Eigen::MatrixXd::Identity(p, p));
  Eigen::MatrixXd XtXinv = Rinv * Rinv.transpose();
  Eigen::VectorXd res = Y - X * beta;
  r.rss = res.squaredNorm();
  r.tss = (Y.array() - Y.mean()).square().sum();
  const double df = r.df_resid;
  const double sigma2 = r.rss / df;
  r.r2 = r.tss > 0 ? 1 - r.rss / r.tss : kNaN;
  r.adj_r2 = 1 - (1 - r.r2) * (static_cast<double>(n) - 1) / df;
  if (p > 1) {
    r.f = ((r.tss - r.rss) / static_cast<double>(p - 1)) / sigma2;
    r.f_p = f_upper_p(r.f, static_cast<double>(p - 1), df);
  } else {
    r.f = r.f_p = kNaN;
  }
  const double tq = t_quantile(0.975, df);
  const double sdy = n > 1 ? sd1(Y) : kNaN;
  for (Eigen::Index k = 0; k < p; ++k) {
    OlsTerm t;
    t.name = names[static_cast<std::size_t>(k)];
    t.coef = beta(k);
    t.se = std::sqrt(sigma2 * XtXinv(k, k));
    t.t = t.coef / t.se;
    t.p = t_two_sided_p(t.t, df);
    t.ci_low = t.coef - tq * t.se;
    t.ci_high = t.coef + tq * t.se;
    if (k > 0) {
      Eigen::MatrixXd others(n, p - 1);
      for (Eigen::Index j = 0, c = 0; j < p; ++j)
        if (j != k) others.col(c++) = X.col(j);
      double r2j = r2_of(others, X.col(k));
      t.vif = 1.0 / (1.0 - r2j);
      t.std_beta = t.coef * sd1(X.col(k)) / sdy;
    }
    r.terms.push_back(t);
  }
  // Min-max weights over |standardized beta| (raw coefficients carry their columns' units).
  double minb = std::numeric_limits<double>::infinity(), maxb = 0;
  for (const auto& t : r.terms)
    if (t.std_beta) { minb = std::min(minb, std::fabs(*t.std_beta)); maxb = std::max(maxb, std::fabs(*t.std_beta)); }
  for (auto& t : r.terms)
    if (t.std_beta && maxb > minb) t.normalised_weight = (std::fabs(*t.std_beta) - minb) / (maxb - minb);
  return r;
}

Json ols_to_json(const OlsResult& r) {
  Json terms = Json::array();
  for (const auto& t : r.terms)
    terms.push_back({{"name", t.name}, {"coef", num(t.coef)}, {"se", num(t.se)}, {"t", num(t.t)}, {"p", num(t.p)},
                     {"ci_low", num(t.ci_low)}, {"ci_high", num(t.ci_high)}, {"vif", num(t.vif)},
                     {"std_beta", num(t.std_beta)}, {"normalised_weight", num(t.normalised_weight)}});
  Json j{{"target", r.target}, {"n", r.n}, {"p", r.p}, {"aliased", r.aliased}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  j.update({{"df_resid", r.df_resid}, {"r2", num(r.r2)}, {"adj_r2", num(r.adj_r2)}, {"f", num(r.f)}, {"f_p", num(r.f_p)},
            {"rss", num(r.rss)}, {"terms", terms}});
  return j;
}

LinFit linregress(const std::string& xname, const std::vector<double>& x, const std::string& yname,
                  const std::vector<double>& y) {
  LinFit f;
  f.x = xname;
  f.y = yname;
  f.slope = f.intercept = f.r = f.r2 = f.p = f.slope_se = f.intercept_se = f.ci_low = f.ci_high = kNaN;
  std::vector<double> xs, ys;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(x[i]) && !std::isnan(y[i])) { xs.push_back(x[i]); ys.push_back(y[i]); }
  f.n = xs.size();
  if (f.n < 3) { f.error = "fewer than 3 complete pairs"; return f; }
  const double n = static_cast<double>(f.n);
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < f.n; ++i) { mx += xs[i]; my += ys[i]; }
  mx /= n;
  my /= n;
  double sxx = 0, syy = 0, sxy = 0, sx2 = 0;
  for (std::size_t i = 0; i < f.n; ++i) {
    sxx += (xs[i] - mx) * (xs[i] - mx);
    syy += (ys[i] - my) * (ys[i] - my);
    sxy += (xs[i] - mx) * (ys[i] - my);
    sx2 += xs[i] * xs[i];
  }
  if (sxx == 0) { f.error = xname + " is constant over the complete pairs"; return f; }
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  const double df = n - 2;
  if (syy == 0) {
    f.r = f.r2 = 0;
  } else {
    f.r = std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
    f.r2 = f.r * f.r;
  }
  f.slope_se = std::sqrt(std::max(0.0, (1 - f.r2) * syy / sxx / df));
  f.intercept_se = f.slope_se * std::sqrt(sx2 / n);
  if (syy == 0) f.p = 1;
  else if (std::fabs(f.r) == 1) f.p = 0;
  else f.p = t_two_sided_p(f.r * std::sqrt(df / (1 - f.r2)), df);
  const double tq = t_quantile(0.975, df);
  f.ci_low = f.slope - tq * f.slope_se;
  f.ci_high = f.slope + tq * f.slope_se;
  return f;
}

Json linfit_to_json(const LinFit& f) {
  Json j{{"x", f.x}, {"y", f.y}, {"n", f.n}};
  if (!f.error.empty()) { j["error"] = f.error; return j; }
  j.update({{"slope", num(f.slope)}, {"intercept", num(f.intercept)}, {"r", num(f.r)}, {"r2", num(f.r2)},
            {"p", num(f.p)}, {"slope_se", num(f.slope_se)}, {"intercept_se", num(f.intercept_se)},
            {"slope_ci_low", num(f.ci_low)}, {"slope_ci_high", num(f.ci_high)}});
  return j;
}

}  // namespace scalelab::analysis
