#pragma once
// Every pair of variables ranked by one [0, 1] effect scale ("top relationships").
//   numeric x numeric       Pearson r, Spearman rho, p of r; effect |r|, sign of r
//   numeric x binary        point-biserial r (Pearson r with the 0/1 side), eta^2 = r^2, p of r,
//                           F1: the best F1 of the class 1 over thresholds t on the numeric side,
//                           predicting 1 for x >= t or for x <= t (both directions);
//                           AUC: P(x of a 1 > x of a 0) + 0.5 P(tie) (roc_auc_score);
//                           effect |r|, sign of r
//   categorical x categorical (binary and categorical columns as wholes) Cramér's V =
//                           sqrt(chi2 / (n (min(r, c) - 1))), chi2 of the contingency table without
//                           continuity correction, p upper tail chi2((r-1)(c-1)); effect V, no sign
// Binary indicators of one categorical's levels are paired with numerics but never with each other.
// q: Benjamini–Hochberg over all pairs with a p-value: q_(i) = min_{j >= i} p_(j) m / j, capped at 1
// (statsmodels multipletests "fdr_bh").
#include <optional>
#include <string>
#include <vector>

#include "analysis/correlation.h"

namespace scalelab::analysis {

struct PairStat {
  std::string a, b, kind;  // kind: "numeric-numeric", "numeric-binary", "categorical-categorical"
  std::size_t n = 0;
  double effect = 0;       // [0, 1]
  int sign = 0;            // -1, 0 (none), +1
  double p = 1, q = 1;
  std::optional<double> r, rho, eta2, f1, auc, cramers_v, chi2;
};

std::vector<PairStat> ranked_pairs(const Frame& frame, const std::vector<Variable>& vars);
std::vector<double> benjamini_hochberg(const std::vector<double>& p);
double best_f1(const std::vector<double>& x, const std::vector<double>& y01);
double auc(const std::vector<double>& x, const std::vector<double>& y01);
Json pair_to_json(const PairStat& s);

}  // namespace scalelab::analysis
