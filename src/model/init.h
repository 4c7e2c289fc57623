#pragma once
// Parameter initialization of a new model, as transformers initializes one.
#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace scalelab {

// Initializes `flat` (CPU, fp32 / bf16 / fp16, layout.total_numel() elements): linear weights and
// embeddings (token, and OPT's positions) ~ normal(0, config.initializer_range), norm weights 1,
// biases (norm biases included) 0, and, for a family whose token embedding has a padding_idx
// (ModelFamilySpec::embedding_padding_idx: OPT, Qwen2), its pad_token_id row 0 (transformers
// zeroes it too). Each value depends only on (seed,
// parameter name, element index) through a counter-based generator (Philox4x32-10 with
// Box-Muller), so the result is bit-identical for any thread count and any layout order (a tied
// and an untied model draw the same embedding).
void init_params(const Tensor& flat, const ParamLayout& layout, const ModelConfig& config, std::uint64_t seed);

// The Philox4x32-10 counter-based generator (Salmon et al., SC'11; the generator of cuRAND and
// of PyTorch's CUDA RNG): four 32-bit outputs for a 128-bit counter and a 64-bit key.
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key);

}  // namespace scalelab
