#pragma once
// The dropout mask bits (dropout.h): what every backend reproduces, element for element. Element i
// of a call keyed by `key` is kept when word (i mod 4) of philox_block(key, i / 4) is >=
// keep_threshold(p).
#include <array>
#include <cmath>
#include <cstdint>

#include "kernels/dropout.h"
#include "core/philox.h"

namespace scalelab::kernels {

// round(p · 2^32), saturated to 2^32 − 1.
inline std::uint32_t keep_threshold(float p) {
  const double t = std::round(static_cast<double>(p) * 4294967296.0);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

// Philox4x32-10 of counter (block, layer·16 + site, step low, step high), key = seed.
inline std::array<std::uint32_t, 4> philox_block(const DropoutKey& k, std::int64_t block) {
  const auto layer_site = static_cast<std::uint64_t>(k.layer) * 16 + static_cast<std::uint64_t>(k.site);
  const auto step = static_cast<std::uint64_t>(k.step);
  // 32 bits of block index (4·2^32 elements per call) and of layer/site; the step's 64 bits.
  return philox4x32_10({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(layer_site),
                        static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)},
                       {static_cast<std::uint32_t>(k.seed), static_cast<std::uint32_t>(k.seed >> 32)});
}

}  // namespace scalelab::kernels
