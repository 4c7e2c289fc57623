#pragma once
// Descriptive statistics of every numeric and binary column, in the reference's convention
// (numpy / scipy with bias=True) and with the sample-corrected forms beside them, labelled:
//   mean, std0 = sqrt(m2) (ddof = 0), std1 (ddof = 1),
//   skew_g1 = m3 / m2^1.5 (biased), kurt_g2 = m4 / m2^2 - 3 (biased, excess),
//   skew_G1 = g1 sqrt(n(n-1)) / (n-2) (n >= 3), kurt_G2 = ((n+1) g2 + 6) (n-1) / ((n-2)(n-3)) (n >= 4)
//   (pandas' skew() and kurt()), min, q25, median, q75, max (linear interpolation, numpy's default),
//   n (present), missing; m_k = mean of (x - mean)^k. Undefined values (a constant column's skew,
//   too few values) are NaN (null in JSON).
#include <cstddef>
#include <string>
#include <vector>

#include "analysis/frame.h"

namespace scalelab::analysis {

struct Describe {
  std::size_t n = 0, missing = 0;
  double mean, std0, std1, skew_g1, kurt_g2, skew_G1, kurt_G2, min, q25, median, q75, max;
};

// Statistics of the present (non-NaN) values.
Describe describe(const std::vector<double>& values);
// The q-th quantile (0..1) of sorted values by linear interpolation.
double quantile_sorted(const std::vector<double>& sorted, double q);
Json describe_to_json(const Describe& d);

// A deterministic split of n rows: a Fisher–Yates shuffle driven by splitmix64(seed) (the
// generator and the shuffle are specified in docs/analysis.md so other tools can reproduce it);
// the first round(fraction * n) shuffled rows are the training rows. Returns per row 1 = train,
// 0 = test.
std::vector<int> split_rows(std::size_t n, double fraction, std::uint64_t seed);
// A permutation of 0..n-1 with the same generator.
std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed);
// Bootstrap resample b (0-based) of n rows: n draws of the same generator started at state
// 1000003 (seed + 1) + b, row = draw mod n (rows repeat; the modulo bias is below n / 2^64).
std::vector<std::size_t> bootstrap_rows(std::size_t n, std::size_t b, std::uint64_t seed);

}  // namespace scalelab::analysis
