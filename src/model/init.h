#pragma once
// Parameter initialization of a new model, as transformers initializes one.
#include <array>
#include <cstdint>

#include "core/philox.h"  // philox4x32_10: the generator of the initialization
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
// LoRA adapters (ParamInfo::is_adapter) as peft initializes them: lora_A kaiming-uniform with
// a = √5 (torch's nn.Linear default: U(-1/√in, 1/√in)), lora_B 0.
void init_params(const Tensor& flat, const ParamLayout& layout, const ModelConfig& config, std::uint64_t seed);

// Only the adapters (as init_params does them): after the base weights were loaded.
void init_adapters(const Tensor& flat, const ParamLayout& layout, std::uint64_t seed);

}  // namespace scalelab
