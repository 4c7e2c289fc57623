#pragma once
// The Philox4x32-10 counter-based generator (Salmon et al., SC'11; the generator of cuRAND and of
// PyTorch's CUDA RNG): four 32-bit outputs for a 128-bit counter and a 64-bit key. Used by the
// parameter initialization (model/init) and the dropout masks every backend reproduces
// (kernels/dropout_mask.h).
#include <array>
#include <cstdint>

namespace scalelab {

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key);

}  // namespace scalelab
