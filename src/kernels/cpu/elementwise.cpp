// Elementwise ops on the CPU (elementwise.h).
#include "kernels/elementwise.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"

namespace scalelab::kernels::cpu {

namespace {
constexpr std::int64_t kChunk = 4096;

// out[i] = a[i] + b[i] over chunks, any float dtypes (out may alias a).
void add_any(void* out, DType ot, const void* a, DType at, const void* b, DType bt, std::int64_t n) {
  if (ot == DType::kF32 && at == DType::kF32 && bt == DType::kF32) {
    float* op = static_cast<float*>(out);
    const float* ap = static_cast<const float*>(a);
    const float* bp = static_cast<const float*>(b);
    parallel_for(n, 1 << 14, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) op[i] = ap[i] + bp[i];
    });
    return;
  }
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, row_grain(kChunk), [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
      const float* ar = load_row(elem(a, at, i0), at, len, 0);
      const float* br = load_row(elem(b, bt, i0), bt, len, 1);
      void* dst = elem(out, ot, i0);
      float* o = out_row(dst, ot, len, 2);
      for (std::int64_t i = 0; i < len; ++i) o[i] = ar[i] + br[i];
      store_row(o, dst, ot, len);
    }
  });
}
}  // namespace

void CpuBackend::add_(Tensor& a, const Tensor& b, ExecContext&) {
  add_any(a.raw(), a.dtype(), a.raw(), a.dtype(), b.raw(), b.dtype(), a.numel());
}

void CpuBackend::add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext&) {
  add_any(out.raw(), out.dtype(), a.raw(), a.dtype(), b.raw(), b.dtype(), a.numel());
}

void CpuBackend::bias_add_(Tensor& y, const Tensor& b, ExecContext&) {
  const std::int64_t F = b.numel(), rows = F > 0 ? y.numel() / F : 0;
  parallel_for(rows, row_grain(F), [&](std::int64_t r0, std::int64_t r1) {
    const float* bp = load_row(b.raw(), b.dtype(), F, 1);
    for (std::int64_t r = r0; r < r1; ++r) {
      void* row = elem(y.raw(), y.dtype(), r * F);
      float* yr = inout_row(row, y.dtype(), F, 0);
      for (std::int64_t j = 0; j < F; ++j) yr[j] += bp[j];
      store_row(yr, row, y.dtype(), F);
    }
  });
}

}  // namespace scalelab::kernels::cpu
