#pragma once
// Distributions: histograms in numpy.histogram's convention and the exact ECDF.
//   edges: `bins` equal-width bins over [min, max] (over [v - 0.5, v + 0.5] when min = max), each
//   bin half-open [e_k, e_k+1) except the last, which is closed; counts per bin.
//   ECDF: the distinct values x_(k) in order with F(x_(k)) = #{x <= x_(k)} / n.
#include <array>
#include <string>
#include <vector>

#include "analysis/frame.h"

namespace scalelab::analysis {

struct Histogram {
  std::vector<double> edges;  // bins + 1
  std::vector<long> counts;   // bins
};
Histogram histogram(const std::vector<double>& values, int bins = 20);  // NaN ignored

// Counts of the values on given edges (numpy.histogram(values, bins=edges)): bin k holds
// e_k <= x < e_k+1, the last bin also x = its right edge; values outside are not counted.
std::vector<long> histogram_counts(const std::vector<double>& values, const std::vector<double>& edges);

struct Ecdf {
  std::vector<double> x, f;
};
Ecdf ecdf(const std::vector<double>& values);

// Categorical vs numeric (statsmodels anova_lm of y ~ C(group), scipy.stats.kruskal):
//   eta^2 = SS_between / SS_total, F = (SS_between/(k-1)) / (SS_within/(N-k)), p upper tail F;
//   Kruskal–Wallis H = (12/(N(N+1)) sum R_g^2/n_g - 3(N+1)) / (1 - sum(t^3 - t)/(N^3 - N)) (ties
//   corrected, average ranks), p upper tail chi2(k-1). Groups: the levels present with the numeric.
// Grouped distributions: `bins` bins over all the values (histogram above), each level's values
// counted on those common edges; each level's exact ECDF; box plots: min, quartiles, median, max
// (numpy's linear quantiles) and Tukey's whiskers, the most extreme values within 1.5 IQR of the
// quartiles, with the values outside them (outliers).
struct GroupTest {
  std::string group, value;
  std::size_t n = 0, k = 0;
  double eta2, f, f_p, h, h_p;
  std::vector<std::string> levels;
  std::vector<std::size_t> sizes;
  std::vector<double> means;
  std::vector<std::array<double, 5>> box;  // per level: min, q25, median, q75, max (linear quantiles)
  std::vector<std::array<double, 2>> whiskers;   // per level: Tukey's low and high whisker
  std::vector<std::vector<double>> outliers;     // per level, sorted
  std::vector<double> edges;                     // common histogram edges
  std::vector<std::vector<long>> counts;         // per level, on the common edges
  std::vector<Ecdf> ecdfs;                       // per level
  std::string error;
};
GroupTest group_test(const std::string& group_name, const std::vector<std::string>& group,
                     const std::string& value_name, const std::vector<double>& value, int bins = 20);
Json group_test_to_json(const GroupTest& g);

}  // namespace scalelab::analysis
