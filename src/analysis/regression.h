#pragma once
// Ordinary least squares with an intercept (statsmodels OLS conventions), through Eigen's
// Householder QR:
//   rows: those where the target and every design column are present
//   aliased columns: a column whose residual after projection on the intercept and the columns
//     kept before it is below 1e-9 of its own norm is dropped and named (a constant column, a
//     duplicate, a linear combination)
//   beta = argmin |y - X beta|^2, RSS = |y - X beta|^2, df = n - p (p counts the intercept)
//   sigma^2 = RSS / df, SE_j = sqrt(sigma^2 [(X'X)^-1]_jj), t_j = beta_j / SE_j, p_j two-sided t(df)
//   R^2 = 1 - RSS/TSS, adjusted R^2 = 1 - (1 - R^2)(n - 1)/df,
//   F = ((TSS - RSS)/(p - 1)) / (RSS/df), p_F upper tail F(p - 1, df)
//   VIF_j = 1 / (1 - R_j^2), R_j^2 of the column on the other kept columns and the intercept
//     (statsmodels' variance_inflation_factor with the constant in the design)
//   standardized beta_j = beta_j sd(x_j) / sd(y); normalised weight_j = (|b_j| - min |b|) /
//     (max |b| - min |b|) over the features' standardized betas b (the reference's min-max
//     weights, on the standardized scale so that units do not decide)
#include <optional>
#include <string>
#include <vector>

#include "analysis/correlation.h"

namespace scalelab::analysis {

struct OlsTerm {
  std::string name;  // "const" for the intercept
  double coef, se, t, p, ci_low, ci_high;
  std::optional<double> vif, std_beta, normalised_weight;  // features only
};

struct OlsResult {
  std::string target;
  std::size_t n = 0, p = 0;
  double df_resid = 0, r2 = 0, adj_r2 = 0, f = 0, f_p = 1, rss = 0, tss = 0;
  std::vector<OlsTerm> terms;
  std::vector<std::string> aliased;
  std::string error;  // non-empty: could not be computed (why)
};

OlsResult ols(const std::string& target, const std::vector<double>& y, const std::vector<Variable>& design);
Json ols_to_json(const OlsResult& r);

// scipy.stats.linregress of y on x over the complete pairs, plus the slope's 95 % interval
// slope ± t_{0.975, n-2} SE.
struct LinFit {
  std::string x, y;
  std::size_t n = 0;
  double slope, intercept, r, r2, p, slope_se, intercept_se, ci_low, ci_high;
  std::string error;
};
LinFit linregress(const std::string& xname, const std::vector<double>& x, const std::string& yname,
                  const std::vector<double>& y);
Json linfit_to_json(const LinFit& f);

}  // namespace scalelab::analysis
