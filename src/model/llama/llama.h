#pragma once
// The Llama decoder (RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, tied or untied LM
// head) and the config / layout pieces the families built on it share: Llama itself and Qwen2
// (the same decoder with q/k/v biases, ModelConfig::qkv_bias).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

namespace scalelab {

std::string llama_layer_prefix(std::int64_t layer);  // "model.layers.<i>."

// A preset of a Llama-like family (head_dim 0: hidden / heads).
ModelConfig llama_like_preset(ModelFamily family, std::string name, std::int64_t hidden, std::int64_t inter,
                              std::int64_t layers, std::int64_t heads, std::int64_t kv, std::int64_t vocab,
                              std::int64_t max_pos, double theta, double rms_norm_eps, bool tied,
                              std::int64_t head_dim = 0);

// The config.json keys Llama and Qwen2 share, with transformers' defaults (LlamaConfig and
// Qwen2Config agree on them but for max_position_embeddings): sizes, num_key_value_heads,
// head_dim (hidden / heads when absent), rms_norm_eps, rope_theta, tie_word_embeddings,
// initializer_range, hidden_act (silu only).
ModelConfig llama_like_from_hf(const nlohmann::json& j, const std::string& source,
                               std::int64_t default_max_position_embeddings, const std::string& display_name);
void llama_like_to_hf(const ModelConfig& c, nlohmann::json& j);
// head_dim even (RoPE), rms_norm_eps and rope_theta positive.
void validate_llama_like(const ModelConfig& c, const std::function<void(const std::string&)>& fail);
std::string describe_llama_like(const ModelConfig& c);  // ", num_key_value_heads 2, head_dim 16"

// Buffer order: model.embed_tokens; per layer input_layernorm, q_proj, k_proj, v_proj weights
// (adjacent: one [q_dim + 2·kv_dim, hidden] GEMM), with qkv_bias their biases (adjacent), o_proj,
// post_attention_layernorm, gate_proj, up_proj (adjacent: one [2·intermediate, hidden] GEMM),
// down_proj; model.norm; lm_head when untied.
void build_llama_layout(const ModelConfig& c, ParamLayout& layout);

// The decoder (src/model/llama/model.cpp); q/k/v biases when the layout has them.
std::unique_ptr<Model> make_llama_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                        const ModelOptions& o);

}  // namespace scalelab
