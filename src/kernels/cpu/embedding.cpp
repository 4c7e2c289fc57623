#include "kernels/embedding.h"

#include <cstring>

#include "core/parallel.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {
void check_ids(const std::int32_t* ids, std::int64_t n, std::int64_t rows, const char* op) {
  for (std::int64_t t = 0; t < n; ++t) {
    if (ids[t] < 0 || ids[t] >= rows) {
      throw InvalidInput(std::string("[") + op + "] token id " + std::to_string(ids[t]) + " at position " +
                         std::to_string(t) + " is outside the table of " + std::to_string(rows) +
                         " rows — the data does not match the model's vocab_size");
    }
  }
}
}  // namespace

void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) {
  ProfileScope prof(ctx, "embedding", Phase::kForward);
  require_cpu(table, "embedding_forward");
  require_dtype(ids, DType::kI32, "embedding_forward", "ids");
  require_dtype(table, DType::kF32, "embedding_forward", "table");
  require_dtype(y, DType::kF32, "embedding_forward", "output");
  const std::int64_t rows = table.dim(0), width = table.dim(1), n = ids.numel();
  require_numel(y, n * width, "embedding_forward", "output");
  const std::int32_t* id = ids.data<std::int32_t>();
  check_ids(id, n, rows, "embedding_forward");
  const float* tab = table.f32();
  float* out = y.f32();
  parallel_for(n, 64, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t)
      std::memcpy(out + t * width, tab + static_cast<std::int64_t>(id[t]) * width, sizeof(float) * width);
  });
}

void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx) {
  ProfileScope prof(ctx, "embedding", Phase::kBackward);
  require_cpu(dtable, "embedding_backward");
  require_dtype(dtable, DType::kF32, "embedding_backward", "table gradient");
  const std::int64_t rows = dtable.dim(0), width = dtable.dim(1), n = ids.numel();
  require_numel(dy, n * width, "embedding_backward", "output gradient");
  const std::int32_t* id = ids.data<std::int32_t>();
  check_ids(id, n, rows, "embedding_backward");
  const float* g = dy.f32();
  float* dt = dtable.f32();
  // Threads own disjoint column ranges, so repeated ids never race and the sum order is fixed.
  parallel_for(width, 16, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t t = 0; t < n; ++t) {
      float* dst = dt + static_cast<std::int64_t>(id[t]) * width;
      const float* src = g + t * width;
      for (std::int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

}  // namespace scalelab::kernels
