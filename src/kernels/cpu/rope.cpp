#include "kernels/rope.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/stage.h"
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

// sign = +1 rotates forward, -1 applies the inverse rotation (the backward).
void rope_apply(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                std::int64_t seq_len, const RopeTable& table, float sign, const char* op) {
  require_cpu(x, op);
  const std::int64_t half = head_dim / 2;
  SCALELAB_CHECK(half == table.half, std::string("[") + op + "] head_dim does not match the rope table");
  SCALELAB_CHECK(seq_len <= table.max_positions,
                 std::string("[") + op + "] sequence length " + std::to_string(seq_len) +
                     " exceeds the rope table's " + std::to_string(table.max_positions) + " positions");
  const std::int64_t rows = x.numel() / ld;
  const DType dt = x.dtype();
  const std::int64_t width = n_heads * head_dim;
  parallel_for(rows, row_grain(width), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t pos = r % seq_len;
      const float* c = table.cos.data() + pos * half;
      const float* s = table.sin.data() + pos * half;
      void* dst = elem(x.raw(), dt, r * ld + col);
      float* row = inout_row(dst, dt, width, 0);
      for (std::int64_t h = 0; h < n_heads; ++h) {
        float* a = row + h * head_dim;
        float* b = a + half;
        for (std::int64_t i = 0; i < half; ++i) {
          const float x1 = a[i], x2 = b[i], si = sign * s[i];
          a[i] = x1 * c[i] - x2 * si;
          b[i] = x2 * c[i] + x1 * si;
        }
      }
      store_row(row, dst, dt, width);
    }
  });
}

}  // namespace

void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                  std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) {
  ProfileScope prof(ctx, "rope", Phase::kForward);
  rope_apply(x, col, ld, n_heads, head_dim, seq_len, table, 1.0f, "rope_forward");
}

void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                   std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) {
  ProfileScope prof(ctx, "rope", Phase::kBackward);
  rope_apply(dx, col, ld, n_heads, head_dim, seq_len, table, -1.0f, "rope_backward");
}

}  // namespace scalelab::kernels
