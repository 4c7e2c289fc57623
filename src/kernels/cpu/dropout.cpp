#include "kernels/dropout.h"

#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/stage.h"
#include "kernels/kernel_common.h"
#include "model/init.h"

namespace scalelab::kernels {

namespace {

std::uint32_t threshold(float p) {
  const double t = std::round(static_cast<double>(p) * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

std::array<std::uint32_t, 4> block(const DropoutKey& k, std::int64_t j) {
  const auto layer_site = static_cast<std::uint64_t>(k.layer) * 16 + static_cast<std::uint64_t>(k.site);
  const auto step = static_cast<std::uint64_t>(k.step);
  // 32 bits of block index (4·2^32 elements per call) and of layer/site; the step's low 32 bits.
  return philox4x32_10({static_cast<std::uint32_t>(j), static_cast<std::uint32_t>(layer_site),
                        static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)},
                       {static_cast<std::uint32_t>(k.seed), static_cast<std::uint32_t>(k.seed >> 32)});
}

void check(float p, const DropoutKey& key, const char* op) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw InvalidInput(std::string("[") + op + "] dropout probability must be in [0, 1), got " + std::to_string(p));
  }
  SCALELAB_CHECK(key.site >= 0 && key.site < 16, std::string("[") + op + "] dropout site must be in 0..15");
}

// dst = src · mask · scale over all elements, in chunks of rows of 4·kBlocks elements.
void apply(Tensor& dst, const Tensor& src, float p, const DropoutKey& key, ExecContext& ctx, Phase phase,
           const char* op) {
  ProfileScope prof(ctx, "dropout", phase);
  require_cpu(src, op);
  check(p, key, op);
  const std::int64_t n = src.numel();
  require_numel(dst, n, op, "output");
  if (p == 0.0f) {
    if (dst.raw() != src.raw()) dst.copy_from(src);
    return;
  }
  const std::uint32_t thr = threshold(p);
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
        const auto r = block(key, (begin + i) / 4);
        for (std::int64_t k = 0; k < 4 && i + k < len; ++k)
          d[i + k] = r[static_cast<std::size_t>(k)] >= thr ? s[i + k] * scale : 0.0f;
      }
      store_row(d, dp, dst.dtype(), len);
    }
  });
}

}  // namespace

bool dropout_keep(float p, const DropoutKey& key, std::int64_t i) {
  check(p, key, "dropout_keep");
  if (p == 0.0f) return true;
  return block(key, i / 4)[static_cast<std::size_t>(i % 4)] >= threshold(p);
}

void dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx) {
  apply(x, x, p, key, ctx, Phase::kForward, "dropout_forward");
}

void dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext& ctx) {
  apply(dx, dy, p, key, ctx, Phase::kBackward, "dropout_backward");
}

}  // namespace scalelab::kernels
