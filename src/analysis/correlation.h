#pragma once
// Correlations (scipy.stats.pearsonr / spearmanr conventions) and the correlation matrix.
//   Pearson r over the pairwise-complete rows; p two-sided from t = r sqrt((n-2)/(1-r^2)), df n-2
//   (the same as scipy's exact beta form); p = 0 when |r| = 1.
//   Spearman rho = Pearson r of the average ranks (ties share their mean rank); p as above.
// The matrix covers the association variables: numeric columns, binary columns (0/1), and one
// 0/1 indicator per level of each categorical ("name=level", all levels). Its clustered order is
// the leaf order of average-linkage agglomerative clustering on the distance 1 - |r| (ties
// broken by the lower index, clusters merged left-to-right), so related variables sit together.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "analysis/frame.h"

namespace scalelab::analysis {

struct Correlation {
  std::size_t n = 0;   // pairwise-complete rows
  double r = 0, p = 1;  // NaN when undefined (n < 3 or a constant side)
};

Correlation pearson(const std::vector<double>& x, const std::vector<double>& y);
Correlation spearman(const std::vector<double>& x, const std::vector<double>& y);
// Average ranks (1-based) of the values; NaN stays NaN.
std::vector<double> average_ranks(const std::vector<double>& v);

// One variable of the association analyses.
struct Variable {
  std::string name;         // column name, or "column=level"
  std::string column;       // the frame column it comes from
  ColumnKind kind;          // kNumeric or kBinary (indicators are binary)
  ColumnRole role;
  std::vector<double> values;
};
std::vector<Variable> association_variables(const Frame& frame);
// Regression design columns: numeric, binary, and k-1 indicators per categorical (first level
// dropped); only columns named in `features`.
std::vector<Variable> design_variables(const Frame& frame, const std::vector<std::string>& features);

struct CorrelationMatrix {
  std::vector<std::string> names;
  std::vector<std::vector<Correlation>> pearson, spearman;
  std::vector<std::size_t> clustered_order;  // by |Pearson r|
};
CorrelationMatrix correlation_matrix(const std::vector<Variable>& vars);
Json correlation_to_json(const CorrelationMatrix& m);
// Average-linkage leaf order on a distance matrix.
std::vector<std::size_t> cluster_order(const std::vector<std::vector<double>>& dist);

}  // namespace scalelab::analysis
