#include "analysis/descriptive.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace scalelab::analysis {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
Json num(double v) { return std::isfinite(v) ? Json(v) : Json(); }
}  // namespace

double quantile_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return kNaN;
  double pos = q * static_cast<double>(v.size() - 1);
  auto lo = static_cast<std::size_t>(std::floor(pos));
  std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

Describe describe(const std::vector<double>& values) {
  Describe d;
  std::vector<double> v;
  for (double x : values) {
    if (std::isnan(x)) ++d.missing;
    else v.push_back(x);
  }
  d.n = v.size();
  d.mean = d.std0 = d.std1 = d.skew_g1 = d.kurt_g2 = d.skew_G1 = d.kurt_G2 = kNaN;
  d.min = d.q25 = d.median = d.q75 = d.max = kNaN;
  if (v.empty()) return d;
  const double n = static_cast<double>(v.size());
  double s = 0;
  for (double x : v) s += x;
  d.mean = s / n;
  double m2 = 0, m3 = 0, m4 = 0;
  for (double x : v) {
    double e = x - d.mean;
    m2 += e * e;
    m3 += e * e * e;
    m4 += e * e * e * e;
  }
  m2 /= n;
  m3 /= n;
  m4 /= n;
  d.std0 = std::sqrt(m2);
  if (v.size() >= 2) d.std1 = std::sqrt(m2 * n / (n - 1));
  if (m2 > 0) {
    d.skew_g1 = m3 / std::pow(m2, 1.5);
    d.kurt_g2 = m4 / (m2 * m2) - 3.0;
    if (v.size() >= 3) d.skew_G1 = d.skew_g1 * std::sqrt(n * (n - 1)) / (n - 2);
    if (v.size() >= 4) d.kurt_G2 = ((n + 1) * d.kurt_g2 + 6) * (n - 1) / ((n - 2) * (n - 3));
  }
  std::sort(v.begin(), v.end());
  d.min = v.front();
  d.max = v.back();
  d.q25 = quantile_sorted(v, 0.25);
  d.median = quantile_sorted(v, 0.5);
  d.q75 = quantile_sorted(v, 0.75);
  return d;
}

Json describe_to_json(const Describe& d) {
  return {{"n", d.n},           {"missing", d.missing},     {"mean", num(d.mean)},       {"std0", num(d.std0)},
          {"std1", num(d.std1)}, {"skew_g1", num(d.skew_g1)}, {"kurt_g2", num(d.kurt_g2)}, {"skew_G1", num(d.skew_G1)},
          {"kurt_G2", num(d.kurt_G2)}, {"min", num(d.min)},   {"q25", num(d.q25)},         {"median", num(d.median)},
          {"q75", num(d.q75)},   {"max", num(d.max)}};
}

namespace {
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<std::size_t> bootstrap_rows(std::size_t n, std::size_t b, std::uint64_t seed) {
  std::uint64_t state = 1000003ULL * (seed + 1) + b;
  std::vector<std::size_t> out(n);
  for (auto& r : out) r = static_cast<std::size_t>(splitmix64(state) % n);
  return out;
}

std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed) {
  std::uint64_t state = seed;
  auto next = [&state]() { return splitmix64(state); };
  std::vector<std::size_t> idx(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = i;
  for (std::size_t i = n; i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(next() % i);
    std::swap(idx[i - 1], idx[j]);
  }
  return idx;
}

std::vector<int> split_rows(std::size_t n, double fraction, std::uint64_t seed) {
  auto idx = shuffled_indices(n, seed);
  auto n_train = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(n)));
  std::vector<int> out(n, 0);
  for (std::size_t k = 0; k < n_train && k < n; ++k) out[idx[k]] = 1;
  return out;
}

}  // namespace scalelab::analysis
