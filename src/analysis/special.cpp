#include "analysis/special.h"

#include <cmath>
#include <limits>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

namespace scalelab::analysis {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

double betainc(double a, double b, double x) {
  if (!(a > 0) || !(b > 0) || !(x >= 0) || !(x <= 1)) return kNaN;
  Eigen::Array<double, 1, 1> A, B, X;
  A(0) = a;
  B(0) = b;
  X(0) = x;
  Eigen::Array<double, 1, 1> r = Eigen::betainc(A, B, X);
  return r(0);
}

double t_two_sided_p(double t, double df) {
  if (!(df > 0) || std::isnan(t)) return kNaN;
  if (std::isinf(t)) return 0.0;
  return betainc(df / 2, 0.5, df / (df + t * t));
}

double f_upper_p(double f, double d1, double d2) {
  if (!(d1 > 0) || !(d2 > 0) || std::isnan(f)) return kNaN;
  if (f <= 0) return 1.0;
  if (std::isinf(f)) return 0.0;
  return betainc(d2 / 2, d1 / 2, d2 / (d2 + d1 * f));
}

double chi2_upper_p(double x, double k) {
  if (!(k > 0) || std::isnan(x)) return kNaN;
  if (x <= 0) return 1.0;
  Eigen::Array<double, 1, 1> A, X;
  A(0) = k / 2;
  X(0) = x / 2;
  Eigen::Array<double, 1, 1> r = Eigen::igammac(A, X);
  return r(0);
}

double t_quantile(double prob, double df) {
  if (!(prob > 0) || !(prob < 1) || !(df > 0)) return kNaN;
  auto cdf = [df](double t) {
    double tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t));
    return t < 0 ? tail : 1 - tail;
  };
  double lo = -1, hi = 1;
  while (cdf(lo) > prob) lo *= 2;
  while (cdf(hi) < prob) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-14 * std::max(1.0, std::fabs(lo)); ++i) {
    double mid = 0.5 * (lo + hi);
    if (cdf(mid) < prob) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace scalelab::analysis
