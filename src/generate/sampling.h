#pragma once
// Choosing the next token from a row of logits, as Hugging Face transformers' `generate` does:
// greedy (argmax, the first index among equal maxima, as torch.argmax), or sampling after the
// logits warpers in generate's order — temperature, then top-k, then top-p — each exactly as
// transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper define it:
//   temperature: logits / T (fp32).
//   top-k:       k' = min(max(k, min_tokens_to_keep), vocab); every logit below the k'-th largest
//                value is removed (set to -inf): ties with the k'-th value are all kept.
//   top-p:       logits sorted ascending (ties in the order torch.sort leaves them on the CPU),
//                the fp32 cumulative sum of their softmax; a token is removed when its cumulative
//                probability is <= 1 - p (fp32), except the last min_tokens_to_keep of the order.
// The sampler then draws from softmax(warped logits) with its own counter-based generator (Philox,
// keyed by the seed, one draw per generated token): the same seed gives the same tokens on any
// machine and thread count; it does not reproduce torch.multinomial's stream.
#include <cstdint>
#include <span>
#include <vector>

namespace scalelab {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (no sampling); > 0: sample after the warpers
  std::int64_t top_k = 0;    // 0: off
  double top_p = 1.0;        // 1: off
  std::int64_t min_tokens_to_keep = 1;
  std::uint64_t seed = 0;
  bool greedy() const { return temperature == 0.0; }
};

// Throws InvalidInput naming the flag: temperature < 0 or not finite, top_k < 0, top_p outside
// (0, 1], min_tokens_to_keep < 1.
void validate_sampling(const SamplingOptions& o);

// The warpers, in place on one row (removed entries become -inf).
void apply_temperature(std::span<float> logits, double temperature);
void apply_top_k(std::span<float> logits, std::int64_t top_k, std::int64_t min_tokens_to_keep);
void apply_top_p(std::span<float> logits, double top_p, std::int64_t min_tokens_to_keep);
// Temperature (when != 1), top-k (when > 0), top-p (when < 1), in that order.
void warp_logits(std::span<float> logits, const SamplingOptions& o);

// The first index of the largest value.
std::int32_t argmax(std::span<const float> logits);

class TokenSampler {
 public:
  explicit TokenSampler(const SamplingOptions& o);
  // The next token from one row of logits (not modified: the warpers work on a copy).
  std::int32_t next(std::span<const float> logits);

 private:
  double uniform();  // [0, 1) from Philox(seed, draw counter)
  SamplingOptions o_;
  std::uint64_t draws_ = 0;
  std::vector<float> work_;
};

}  // namespace scalelab
