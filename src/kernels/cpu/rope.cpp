// Rotary embeddings on the CPU (rope.h).
#include "kernels/rope.h"

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels::cpu {

namespace {

// sign = +1 rotates forward, -1 applies the inverse rotation (the backward).
void rope_apply(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                std::int64_t seq_len, const RopeTable& table, float sign) {
  const std::int64_t half = head_dim / 2;
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

void CpuBackend::rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads,
                              std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table, ExecContext&) {
  rope_apply(x, col, ld, n_heads, head_dim, seq_len, table, 1.0f);
}

void CpuBackend::rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads,
                               std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table, ExecContext&) {
  rope_apply(dx, col, ld, n_heads, head_dim, seq_len, table, -1.0f);
}

}  // namespace scalelab::kernels::cpu
