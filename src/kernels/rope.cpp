// Front of the rope family (rope.h): the tables (host math), validation, profiling, dispatch.
#include "kernels/rope.h"

#include <cmath>

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling) {
  const std::int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  const float base = static_cast<float>(theta);
  for (std::int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32.
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<std::size_t>(i)] = 1.0f / std::pow(base, e);
  }
  if (scaling) {
    // transformers' _compute_llama3_parameters, element by element in fp32.
    const float factor = static_cast<float>(scaling->factor);
    const float low = static_cast<float>(scaling->low_freq_factor);
    const float high = static_cast<float>(scaling->high_freq_factor);
    const float old_ctx = static_cast<float>(scaling->original_max_position_embeddings);
    const double low_wavelen = static_cast<double>(scaling->original_max_position_embeddings) / scaling->low_freq_factor;
    const double high_wavelen = static_cast<double>(scaling->original_max_position_embeddings) / scaling->high_freq_factor;
    for (auto& f : inv) {
      const float wavelen = static_cast<float>(2.0 * M_PI) / f;
      float g = wavelen > low_wavelen ? f / factor : f;
      const float smooth = (old_ctx / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * g / factor + smooth * g;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : g;
    }
  }
  return inv;
}

RopeTable make_rope_table(std::int64_t head_dim, std::int64_t max_positions, double theta,
                          const std::optional<RopeScaling>& scaling) {
  RopeTable t;
  t.max_positions = max_positions;
  t.half = head_dim / 2;
  t.inv_freq = rope_inv_freq(head_dim, theta, scaling);
  t.cos.resize(static_cast<std::size_t>(max_positions * t.half));
  t.sin.resize(t.cos.size());
  for (std::int64_t p = 0; p < max_positions; ++p) {
    for (std::int64_t i = 0; i < t.half; ++i) {
      const float angle = static_cast<float>(p) * t.inv_freq[static_cast<std::size_t>(i)];
      t.cos[static_cast<std::size_t>(p * t.half + i)] = std::cos(angle);
      t.sin[static_cast<std::size_t>(p * t.half + i)] = std::sin(angle);
    }
  }
  return t;
}

namespace {

using RopeMethod = void (Backend::*)(Tensor&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                     const RopeTable&, ExecContext&);

// Forward and backward differ only in the rotation's sign, so one front serves both.
void rope(RopeMethod method, const char* op, Phase phase, Tensor& x, std::int64_t col, std::int64_t ld,
          std::int64_t n_heads, std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table,
          ExecContext& ctx) {
  ProfileScope prof(ctx, "rope", phase);
  SCALELAB_CHECK(head_dim / 2 == table.half, std::string("[") + op + "] head_dim does not match the rope table");
  SCALELAB_CHECK(seq_len <= table.max_positions,
                 std::string("[") + op + "] sequence length " + std::to_string(seq_len) +
                     " exceeds the rope table's " + std::to_string(table.max_positions) + " positions");
  (backend_for(device_of(op, {&x}), op).*method)(x, col, ld, n_heads, head_dim, seq_len, table, ctx);
}

}  // namespace

void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                  std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) {
  rope(&Backend::rope_forward, "rope_forward", Phase::kForward, x, col, ld, n_heads, head_dim, seq_len, table, ctx);
}

void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                   std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) {
  rope(&Backend::rope_backward, "rope_backward", Phase::kBackward, dx, col, ld, n_heads, head_dim, seq_len, table,
       ctx);
}

}  // namespace scalelab::kernels
