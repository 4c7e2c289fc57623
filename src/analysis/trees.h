#pragma once
// Tree-model importances (#11) through libxgboost's C API (Debian's libxgboost-dev, 1.7.x),
// deterministic: seed 0, one thread, the exact tree method.
//   random forest:      one round of num_parallel_tree = 64 trees, subsample 0.8,
//                       colsample_bynode 0.8, learning_rate 1, max_depth 6
//   gradient boosting:  100 rounds, learning_rate 0.1, max_depth 3
// Both: objective reg:squarederror, base_score = the mean of the training labels (written
// "%.17g"), missing = NaN.
// Importances from the model fitted on all rows: gain, weight, cover, each scaled 100 x / max
// (features never used score 0). Cross-validated R^2 and RMSE over K folds (the split generator of
// docs/analysis.md: fold of the row at position q is q mod K): each fold predicted by the model
// fitted on the others; R^2 = 1 - SS_res / SS_tot over all rows. Permutation importance: in each
// fold, the held-out rows' column j is permuted (the same generator, seed 1 + j) and the increase
// of the fold's mean squared error recorded; mean and sd (ddof 1) over the folds.
// TreeSHAP (libxgboost's pred_contribs, model fitted on all rows): mean |contribution| per
// feature, and the largest additivity error |sum of contributions + bias - prediction|.
// A model with cross-validated R^2 below 0.5 is flagged "unreliable": its importances describe a
// surrogate that does not predict the target.
#include <string>
#include <vector>

#include "analysis/correlation.h"

namespace scalelab::analysis {

struct TreeModelResult {
  std::string model;  // "random_forest", "gradient_boosting"
  std::string target;
  std::size_t n = 0;
  int folds = 0;
  double cv_r2 = 0, cv_rmse = 0;
  bool unreliable = false;
  std::vector<std::string> features;
  std::vector<double> gain, weight, cover;            // scaled 100 x / max
  std::vector<double> perm_mean, perm_sd;             // increase of MSE
  std::vector<double> shap_mean_abs;                  // TreeSHAP: mean |contribution| over the rows
  double shap_additivity_error = 0;                   // max |sum of contributions + bias - prediction|
  std::string error;
};

// InvalidInput-free: problems land in `error`. `folds` >= 2.
std::vector<TreeModelResult> tree_importances(const std::string& target, const std::vector<double>& y,
                                              const std::vector<Variable>& design, int folds);
Json tree_result_to_json(const TreeModelResult& r);
std::string xgboost_version();

}  // namespace scalelab::analysis
