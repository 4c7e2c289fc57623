#pragma once
// Model configurations: read from a Hugging Face config.json, written back to one, and named
// presets with the published shapes. One struct serves every family (Llama, OPT, Qwen2); fields
// that belong to some families only are ignored by the others. What differs per family lives in
// its descriptor (model/family.h, src/model/<family>/family.cpp); this file asks the registry.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab {

// One value per registered family, in the registry's order (src/model/family.cpp).
enum class ModelFamily { kLlama, kOPT, kQwen2 };
// The family's descriptor name ("llama", "opt", "qwen2").
const char* family_name(ModelFamily f);

// Llama-3 style rope scaling ("rope_type": "llama3" in config.json).
struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

// The largest sizes a config may have (ModelConfig::validate refuses more): far above any
// published model, low enough that every product the engine forms fits in 64 bits.
inline constexpr std::int64_t kMaxModelWidth = std::int64_t{1} << 20;      // hidden, intermediate, head_dim, projections
inline constexpr std::int64_t kMaxModelLayers = std::int64_t{1} << 12;
inline constexpr std::int64_t kMaxModelHeads = std::int64_t{1} << 14;
inline constexpr std::int64_t kMaxModelVocab = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxModelPositions = std::int64_t{1} << 24;

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  std::string name;  // preset name or the directory it came from

  // Shared fields (HF names).
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;  // OPT: ffn_dim
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  // OPT: = num_attention_heads
  std::int64_t head_dim = 0;             // default hidden_size / num_attention_heads
  std::int64_t vocab_size = 0;
  std::int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = true;
  double initializer_range = 0.02;

  // Llama and Qwen2.
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // Llama only
  // Biases on q_proj, k_proj and v_proj (not o_proj): Qwen2 always, Llama never.
  bool qkv_bias = false;

  // OPT.
  bool do_layer_norm_before = true;
  std::int64_t word_embed_proj_dim = 0;  // != hidden_size: project_in / project_out exist
  std::string activation_function = "relu";
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  double dropout = 0.0;
  double layer_norm_eps = 1e-5;
  // config.json "_remove_final_layer_norm" (checkpoints fine-tuned before transformers 4.20.1):
  // no final decoder LayerNorm even when do_layer_norm_before.
  bool remove_final_layer_norm = false;
  // The token embedding's padding_idx (config.json "pad_token_id"; OPT: 1): that row of the
  // embedding table gets no gradient from the lookup, as torch.nn.Embedding(padding_idx) does.
  // Read by the families whose descriptor says embedding_padding_idx (OPT, Qwen2).
  std::optional<std::int64_t> pad_token_id;

  // OPT has a final decoder LayerNorm (transformers' OPTDecoder.final_layer_norm).
  bool has_final_layer_norm() const { return do_layer_norm_before && !remove_final_layer_norm; }

  // Checks the shapes are consistent (the shared checks, then the family's); throws InvalidInput
  // naming the field and `source`.
  void validate(const std::string& source) const;

  std::int64_t q_dim() const { return num_attention_heads * head_dim; }
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  nlohmann::json to_hf_json() const;
};

// Parses a Hugging Face config.json object. `source` names the file in error messages.
ModelConfig config_from_hf_json(const nlohmann::json& j, const std::string& source);
// Reads <dir>/config.json.
ModelConfig load_config_dir(const std::string& dir);
// "llama-3.2-1b", "llama-small", "opt-125m", ...; throws InvalidInput listing the presets.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();
bool is_preset(const std::string& name);
// A preset name, or a directory holding config.json.
ModelConfig resolve_model(const std::string& model);

}  // namespace scalelab
