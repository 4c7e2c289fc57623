#pragma once
// A plain AdamW over a range of flat buffers (as the HF Trainer's torch.optim.AdamW), for the
// ZeRO tests: the trainer's own optimizer is not in this branch. States are indexed relative to
// `state_base`, so a shard's states hold only the shard.
#include <cmath>
#include <cstdint>
#include <vector>

namespace scalelab::testing {

struct AdamWRef {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  std::int64_t step = 1;
  float clip = 1.0f;  // multiplies the gradient (global-norm clipping factor)
  std::vector<float> m, v;
  std::int64_t state_base = 0;

  void init(std::int64_t begin, std::int64_t end) {
    state_base = begin;
    m.assign(static_cast<std::size_t>(end - begin), 0.0f);
    v.assign(static_cast<std::size_t>(end - begin), 0.0f);
  }
  void update(float* params, const float* grads, std::int64_t begin, std::int64_t end) {
    const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    for (std::int64_t i = begin; i < end; ++i) {
      const std::size_t s = static_cast<std::size_t>(i - state_base);
      const float g = grads[i] * clip;
      m[s] = beta1 * m[s] + (1 - beta1) * g;
      v[s] = beta2 * v[s] + (1 - beta2) * g * g;
      params[i] -= lr * weight_decay * params[i];
      params[i] -= lr * (m[s] / bc1) / (std::sqrt(v[s] / bc2) + eps);
    }
  }
};

// Deterministic per-rank test values, so that every rank can compute every other rank's data.
inline float test_value(int rank, std::int64_t i, int salt = 0) {
  const std::uint32_t h = static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>(rank * 40503 + salt * 977);
  return static_cast<float>(h % 2001) / 1000.0f - 1.0f;  // in [-1, 1], exact in fp32
}

}  // namespace scalelab::testing
