// Embeddings on the CPU (embedding.h).
#include "kernels/embedding.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/parallel.h"
#include "core/error.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels::cpu {

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

void CpuBackend::embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext&) {
  const std::int64_t rows = table.dim(0), width = table.dim(1), n = ids.numel();
  const std::int32_t* id = ids.data<std::int32_t>();
  check_ids(id, n, rows, "embedding_forward");
  parallel_for(n, row_grain(width), [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t)
      convert(elem(table.raw(), table.dtype(), static_cast<std::int64_t>(id[t]) * width), table.dtype(),
              elem(y.raw(), y.dtype(), t * width), y.dtype(), static_cast<std::size_t>(width));
  });
}

void CpuBackend::embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext&,
                                    std::int64_t skip_id) {
  const std::int64_t rows = dtable.dim(0), width = dtable.dim(1), n = ids.numel();
  const std::int32_t* id = ids.data<std::int32_t>();
  check_ids(id, n, rows, "embedding_backward");
  // Positions grouped by id (stable): each row's gradient is summed in fp32 in position order and
  // added to the table once, so low-precision tables round once and threads never share a row.
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return id[a] < id[b]; });
  std::vector<std::int64_t> starts;
  for (std::int64_t i = 0; i < n; ++i)
    if (i == 0 || id[order[static_cast<std::size_t>(i)]] != id[order[static_cast<std::size_t>(i - 1)]]) starts.push_back(i);
  starts.push_back(n);
  const std::int64_t groups = static_cast<std::int64_t>(starts.size()) - 1;
  parallel_for(groups, row_grain(width), [&](std::int64_t g0, std::int64_t g1) {
    float* acc = row_buffer(width, 0);
    for (std::int64_t g = g0; g < g1; ++g) {
      if (id[order[static_cast<std::size_t>(starts[static_cast<std::size_t>(g)])]] == skip_id) continue;
      std::fill(acc, acc + width, 0.0f);
      for (std::int64_t i = starts[static_cast<std::size_t>(g)]; i < starts[static_cast<std::size_t>(g + 1)]; ++i) {
        const std::int64_t t = order[static_cast<std::size_t>(i)];
        const float* src = load_row(elem(dy.raw(), dy.dtype(), t * width), dy.dtype(), width, 1);
        for (std::int64_t c = 0; c < width; ++c) acc[c] += src[c];
      }
      const std::int64_t row = id[order[static_cast<std::size_t>(starts[static_cast<std::size_t>(g)])]];
      void* dst = elem(dtable.raw(), dtable.dtype(), row * width);
      float* d = inout_row(dst, dtable.dtype(), width, 2);
      for (std::int64_t c = 0; c < width; ++c) d[c] += acc[c];
      store_row(d, dst, dtable.dtype(), width);
    }
  });
}

void CpuBackend::position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                                ExecContext&) {
  const std::int64_t width = table.dim(1), n = y.numel() / width;
  parallel_for(n, row_grain(width), [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* pr = load_row(elem(table.raw(), table.dtype(), (t % seq + offset) * width), table.dtype(), width, 0);
      void* dst = elem(y.raw(), y.dtype(), t * width);
      float* yr = inout_row(dst, y.dtype(), width, 1);
      for (std::int64_t c = 0; c < width; ++c) yr[c] += pr[c];
      store_row(yr, dst, y.dtype(), width);
    }
  });
}

void CpuBackend::position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                             ExecContext&) {
  const std::int64_t width = dtable.dim(1), n = dy.numel() / width;
  const std::int64_t batch = n / seq;
  // One position per task: its rows summed in fp32 in batch order, added to the table once.
  parallel_for(seq, row_grain(width * batch), [&](std::int64_t p0, std::int64_t p1) {
    float* acc = row_buffer(width, 0);
    for (std::int64_t p = p0; p < p1; ++p) {
      std::fill(acc, acc + width, 0.0f);
      for (std::int64_t b = 0; b < batch; ++b) {
        const float* src = load_row(elem(dy.raw(), dy.dtype(), (b * seq + p) * width), dy.dtype(), width, 1);
        for (std::int64_t c = 0; c < width; ++c) acc[c] += src[c];
      }
      void* dst = elem(dtable.raw(), dtable.dtype(), (p + offset) * width);
      float* d = inout_row(dst, dtable.dtype(), width, 2);
      for (std::int64_t c = 0; c < width; ++c) d[c] += acc[c];
      store_row(d, dst, dtable.dtype(), width);
    }
  });
}

}  // namespace scalelab::kernels::cpu
