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
// SHAP interactions (pred_interactions, rows x (p+1) x (p+1)): mean |phi_jk| per pair of
// features (the diagonal is the main effect), and the largest additivity error
// |sum_k phi_jk - contribution_j| (each row of a row's interaction matrix sums to its
// contribution). Dependence data for the top features by mean |contribution| (at most
// `dependence_top`, those above 0, ties in feature order): each row's (value, contribution) and
// the feature it interacts with most (largest mean |phi_jk|, k != j, the first on ties).
// Stability over bootstrap resamples (bootstrap_rows in descriptive.h; the model refitted on each
// resample, base_score its label mean): for gain, weight, cover and mean |SHAP| (over all rows)
// per feature the mean, sd (ddof 1), 2.5 / 97.5 percentiles (linear); the rank (1 = most
// important, ties averaged) with its mean, 2.5 / 97.5 percentiles and the share of resamples in
// the top 3; Spearman's rho of each resample's importances with the all-rows model's (mean over
// the resamples where both vary) and the share of resamples whose top feature (the first maximum)
// is the all-rows model's.
// A model with cross-validated R^2 below 0.5 is flagged "unreliable": its importances describe a
// surrogate that does not predict the target.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/correlation.h"

namespace scalelab::analysis {

struct TreeOptions {
  int folds = 5;           // >= 2
  int bootstrap = 50;      // resamples for the stability (0: none)
  std::uint64_t seed = 0;  // of the resamples
  int dependence_top = 5;  // features with dependence data
};

struct ShapDependence {
  std::size_t feature = 0;              // index into features
  std::vector<double> x, shap;          // per row with the target: the value (NaN missing), its contribution
  std::optional<std::size_t> color_by;  // the feature it interacts with most
  std::vector<double> color_x;          // that feature's values per row (for colouring)
};

struct ImportanceStability {
  std::vector<double> mean, sd, low, high;                     // of the importance, per feature
  std::vector<double> mean_rank, rank_low, rank_high, top3_share;
  double spearman_mean = 0;  // NaN when no resample has a defined rho
  int spearman_n = 0;
  double top1_share = 0;
};

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
  std::vector<std::vector<double>> interaction_mean_abs;  // p x p, mean |phi_jk|
  double interaction_additivity_error = 0;                // max |sum_k phi_jk - contribution_j|
  std::vector<ShapDependence> dependence;
  int resamples = 0;
  std::map<std::string, ImportanceStability> stability;   // "gain", "weight", "cover", "shap_mean_abs"
  std::string error;
};

// InvalidInput-free: problems land in `error`. `folds` >= 2.
std::vector<TreeModelResult> tree_importances(const std::string& target, const std::vector<double>& y,
                                              const std::vector<Variable>& design, const TreeOptions& options);
Json tree_result_to_json(const TreeModelResult& r);
std::string xgboost_version();

}  // namespace scalelab::analysis
