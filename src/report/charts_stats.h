#pragma once
// The report's charts of the #2 / #12 numbers (analysis/scaling_curves.h, analysis/trees.h):
// cost and energy per token against the device count (the curves against the batch size and the
// sequence length are scaling_facets.cpp's card), the SHAP interaction matrix, the bootstrap intervals of the importances and the
// SHAP dependence of the top feature, and the grouped histograms with an ECDF per level (#6).
// Appended at the end of build_charts (report/charts.h).
#include <vector>

#include "report/charts.h"

namespace scalelab::report {

void stats_charts(const Json& analysis, std::vector<Chart>& out);

}  // namespace scalelab::report
