#pragma once
// The tables and Markdown of the #12 tree-model details (analysis/trees.h): the SHAP interaction
// matrix (shap_interactions.csv, one row per pair), the dependence points
// (shap_dependence.csv, one row per feature x row) and the bootstrap stability of the importances
// (importance_stability.csv, one row per model x importance x feature).
#include <string>
#include <utility>
#include <vector>

#include "analysis/trees.h"
#include "lab/table.h"

namespace scalelab::analysis {

// File stem -> table, for the models that were computed (results with an error are skipped).
std::vector<std::pair<std::string, lab::Table>> tree_detail_tables(const std::vector<TreeModelResult>& results);

// Markdown: per model, the strongest interacting pairs and the stability of the gain and SHAP
// importances (mean, 95 % interval, mean rank, top-3 share, rho with the all-rows model).
std::string tree_detail_markdown(const std::vector<TreeModelResult>& results);

}  // namespace scalelab::analysis
