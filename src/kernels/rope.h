#pragma once
// Rotary position embeddings (rope family), rotate-half convention as Hugging Face Llama
// checkpoints expect: for each head, the pairs (i, i + head_dim/2) rotate by angle pos·inv_freq[i]:
//   x1' = x1·cos − x2·sin,   x2' = x2·cos + x1·sin.
// inv_freq follows transformers exactly (computed in fp32), including the "llama3" rope_scaling.
//
// rope_forward / rope_backward work in place on heads packed in rows: row t of `x` (row stride
// `ld` elements) holds `n_heads` heads of `head_dim` starting at column `col`; the position of
// row t is t % seq_len. Backward applies the inverse rotation to the gradient (assigned in place).
#include <optional>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "model/config.h"

namespace scalelab::kernels {

struct RopeTable {
  std::int64_t max_positions = 0;
  std::int64_t half = 0;  // head_dim / 2
  std::vector<float> inv_freq;
  std::vector<float> cos;  // [max_positions, half]
  std::vector<float> sin;
};

// inv_freq as transformers computes it (rope_theta, optional llama3 scaling).
std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling);
RopeTable make_rope_table(std::int64_t head_dim, std::int64_t max_positions, double theta,
                          const std::optional<RopeScaling>& scaling);

void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                  std::int64_t seq_len, const RopeTable& table, ExecContext& ctx);
void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                   std::int64_t seq_len, const RopeTable& table, ExecContext& ctx);

}  // namespace scalelab::kernels
