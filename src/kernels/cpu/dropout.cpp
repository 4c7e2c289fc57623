// Dropout on the CPU (dropout.h): the counter-based mask of dropout_mask.h.
#include "kernels/dropout.h"

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/dropout_mask.h"

namespace scalelab::kernels::cpu {

namespace {

// dst = src · mask · scale over all elements, in chunks of rows of 4·kBlocks elements.
void apply(Tensor& dst, const Tensor& src, float p, const DropoutKey& key) {
  const std::int64_t n = src.numel();
  if (p == 0.0f) {
    if (dst.raw() != src.raw()) dst.copy_from(src);
    return;
  }
  const std::uint32_t thr = keep_threshold(p);
  const float scale = 1.0f / (1.0f - p);
  constexpr std::int64_t kChunk = 1024;  // elements per staged row (a multiple of 4)
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  parallel_for(chunks, row_grain(kChunk), [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
      const float* s = load_row(elem(src.raw(), src.dtype(), begin), src.dtype(), len, 0);
      void* dp = elem(dst.raw(), dst.dtype(), begin);
      float* d = out_row(dp, dst.dtype(), len, 1);
      for (std::int64_t i = 0; i < len; i += 4) {
        const auto r = philox_block(key, (begin + i) / 4);
        for (std::int64_t k = 0; k < 4 && i + k < len; ++k)
          d[i + k] = r[static_cast<std::size_t>(k)] >= thr ? s[i + k] * scale : 0.0f;
      }
      store_row(d, dp, dst.dtype(), len);
    }
  });
}

}  // namespace

void CpuBackend::dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext&) { apply(x, x, p, key); }

void CpuBackend::dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext&) {
  apply(dx, dy, p, key);
}

}  // namespace scalelab::kernels::cpu
