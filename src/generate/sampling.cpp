#include "generate/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace scalelab {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

void validate_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw InvalidInput("[--temperature] must be a finite number >= 0 (0: greedy), got " + std::to_string(o.temperature));
  }
  if (o.top_k < 0) throw InvalidInput("[--top-k] must be >= 0 (0: off), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    throw InvalidInput("[--top-p] must be in (0, 1] (1: off), got " + std::to_string(o.top_p));
  }
  if (o.min_tokens_to_keep < 1) {
    throw InvalidInput("[--min-tokens-to-keep] must be >= 1, got " + std::to_string(o.min_tokens_to_keep));
  }
}

void apply_temperature(std::span<float> logits, double temperature) {
  const float t = static_cast<float>(temperature);
  for (float& x : logits) x = x / t;
}

void apply_top_k(std::span<float> logits, std::int64_t top_k, std::int64_t min_tokens_to_keep) {
  const auto n = static_cast<std::int64_t>(logits.size());
  const std::int64_t k = std::min(std::max(top_k, min_tokens_to_keep), n);
  if (k <= 0 || n == 0) return;
  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float kth = sorted[static_cast<std::size_t>(k - 1)];
  for (float& x : logits)
    if (x < kth) x = kNegInf;
}

void apply_top_p(std::span<float> logits, double top_p, std::int64_t min_tokens_to_keep) {
  const std::size_t n = logits.size();
  if (n == 0) return;
  // The ascending order of torch.sort(stable=False) on the CPU, ties included: ATen sorts
  // (value, index) pairs, indices 0..n-1 in order, with std::sort and a value-only comparison, so
  // the same call here leaves tied logits in the same (unspecified but deterministic) order —
  // checked against torch on rows with many ties (tests/generate/sampling_test.cpp).
  std::vector<std::pair<float, std::int32_t>> pairs(n);
  for (std::size_t i = 0; i < n; ++i) pairs[i] = {logits[i], static_cast<std::int32_t>(i)};
  std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::int32_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = pairs[i].second;
  // softmax over the sorted row in fp32 (max subtracted), then its running sum in fp32.
  const float mx = logits[static_cast<std::size_t>(order.back())];
  std::vector<float> p(n);
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = std::exp(logits[static_cast<std::size_t>(order[i])] - mx);
    sum += p[i];
  }
  const float cut = static_cast<float>(1.0 - top_p);
  const std::size_t keep_from = n > static_cast<std::size_t>(min_tokens_to_keep) ? n - static_cast<std::size_t>(min_tokens_to_keep) : 0;
  float cum = 0;
  std::vector<std::int32_t> removed;
  for (std::size_t i = 0; i < n; ++i) {
    cum += p[i] / sum;
    if (cum <= cut && i < keep_from) removed.push_back(order[i]);
  }
  for (std::int32_t i : removed) logits[static_cast<std::size_t>(i)] = kNegInf;
}

void warp_logits(std::span<float> logits, const SamplingOptions& o) {
  if (o.temperature != 1.0) apply_temperature(logits, o.temperature);
  if (o.top_k > 0) apply_top_k(logits, o.top_k, o.min_tokens_to_keep);
  if (o.top_p < 1.0) apply_top_p(logits, o.top_p, o.min_tokens_to_keep);
}

std::int32_t argmax(std::span<const float> logits) {
  SCALELAB_CHECK(!logits.empty(), "[generate] empty logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<std::int32_t>(best);
}

TokenSampler::TokenSampler(const SamplingOptions& o) : o_(o) { validate_sampling(o); }

double TokenSampler::uniform() {
  const std::uint64_t c = draws_++;
  const auto r = philox4x32_10({static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c >> 32), 0x67656e65u, 0u},
                               {static_cast<std::uint32_t>(o_.seed), static_cast<std::uint32_t>(o_.seed >> 32)});
  // 53 random bits -> [0, 1).
  const std::uint64_t bits = (static_cast<std::uint64_t>(r[0]) << 21) ^ (static_cast<std::uint64_t>(r[1]) >> 11);
  return static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

std::int32_t TokenSampler::next(std::span<const float> logits) {
  if (o_.greedy()) return argmax(logits);
  work_.assign(logits.begin(), logits.end());
  warp_logits(work_, o_);
  const float mx = *std::max_element(work_.begin(), work_.end());
  double sum = 0;
  for (float& x : work_) {
    x = x == kNegInf ? 0.0f : std::exp(x - mx);
    sum += x;
  }
  const double u = uniform() * sum;
  double acc = 0;
  std::int32_t last = 0;
  for (std::size_t i = 0; i < work_.size(); ++i) {
    if (work_[i] <= 0) continue;
    acc += work_[i];
    last = static_cast<std::int32_t>(i);
    if (u < acc) return last;
  }
  return last;  // rounding at the very end of the sum: the last kept token
}

}  // namespace scalelab
