// The Qwen2 family's descriptor (transformers' Qwen2ForCausalLM, Qwen2 and Qwen2.5): the Llama
// decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) with biases on q_proj, k_proj and
// v_proj (not o_proj), head_dim = hidden_size / num_attention_heads, no rope scaling and no
// sliding-window attention. It reuses Llama's layout and model (ModelConfig::qkv_bias) and adds
// only what differs: presets, config.json keys, checks, the padding_idx of its embedding.
#include "core/error.h"
#include "model/family.h"
#include "model/hf_json.h"
#include "model/llama/llama.h"

namespace scalelab {

namespace {

using nlohmann::json;
using hf_json::get_or;

ModelConfig qwen2_preset(std::string name, std::int64_t hidden, std::int64_t inter, std::int64_t layers,
                         std::int64_t heads, std::int64_t kv, std::int64_t vocab, std::int64_t max_pos, bool tied) {
  ModelConfig c = llama_like_preset(ModelFamily::kQwen2, std::move(name), hidden, inter, layers, heads, kv, vocab,
                                    max_pos, 1000000.0, 1e-6, tied);
  c.qkv_bias = true;
  return c;
}

std::vector<ModelConfig> presets() {
  return {
      // Published shapes (Qwen/Qwen2.5-0.5B config.json).
      qwen2_preset("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, 32768, true),
      // Small models for this project's CPU benchmarks and tests.
      qwen2_preset("qwen2-small", 512, 1536, 8, 8, 2, 32768, 4096, true),
      qwen2_preset("qwen2-tiny", 64, 128, 2, 4, 2, 256, 512, true),
  };
}

ModelConfig from_hf(const json& j, const std::string& source) {
  // Qwen2Config's defaults: max_position_embeddings 32768, rope_theta 10000 (Qwen2.5 checkpoints
  // say 1000000 in their config.json), rms_norm_eps 1e-6, tie_word_embeddings false.
  ModelConfig c = llama_like_from_hf(j, source, 32768, "Qwen2");
  c.qkv_bias = true;
  if (get_or<bool>(j, "use_sliding_window", false, source)) {
    hf_json::fail(source, "use_sliding_window true is not supported (scalelab's attention is full causal) — set "
                          "\"use_sliding_window\": false");
  }
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    hf_json::fail(source, "rope_scaling " + j.at("rope_scaling").dump() +
                              " is not supported for Qwen2 — set \"rope_scaling\": null");
  }
  const double attn_dropout = get_or<double>(j, "attention_dropout", 0.0, source);
  if (attn_dropout != 0.0) {
    hf_json::fail(source, "attention_dropout " + std::to_string(attn_dropout) +
                              " is not supported — set \"attention_dropout\": 0.0");
  }
  // nn.Embedding(padding_idx=pad_token_id), as transformers builds Qwen2Model (default: none).
  if (j.contains("pad_token_id") && !j.at("pad_token_id").is_null()) {
    c.pad_token_id = get_or<std::int64_t>(j, "pad_token_id", 0, source);
  }
  return c;
}

void to_hf(const ModelConfig& c, json& j) {
  llama_like_to_hf(c, j);
  j["model_type"] = "qwen2";
  j["architectures"] = json::array({"Qwen2ForCausalLM"});
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;  // what Qwen2Config stores when use_sliding_window is false
  j["max_window_layers"] = c.num_hidden_layers;
  j["rope_scaling"] = nullptr;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
}

void validate(const ModelConfig& c, const std::function<void(const std::string&)>& fail) {
  validate_llama_like(c, fail);
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    fail("head_dim " + std::to_string(c.head_dim) + " is not hidden_size / num_attention_heads (" +
         std::to_string(c.hidden_size) + " / " + std::to_string(c.num_attention_heads) +
         ") — Qwen2 derives head_dim from them; drop \"head_dim\" from config.json");
  }
  if (!c.qkv_bias) fail("Qwen2 has q/k/v biases — qkv_bias must be true");
  if (c.rope_scaling) fail("rope_scaling is not supported for Qwen2 — set \"rope_scaling\": null");
}

}  // namespace

const ModelFamilySpec& qwen2_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec f;
    f.id = ModelFamily::kQwen2;
    f.name = "qwen2";
    f.display_name = "Qwen2";
    f.hf_model_types = {"qwen2"};
    f.presets = presets();
    f.config_from_hf = from_hf;
    f.config_to_hf = to_hf;
    f.validate = validate;
    f.describe = describe_llama_like;
    f.build_layout = build_llama_layout;  // with the q/k/v biases (qkv_bias)
    f.layer_prefix = llama_layer_prefix;
    f.token_embedding = "model.embed_tokens.weight";
    f.embedding_padding_idx = true;
    f.ignored_tensor_suffixes = {".rotary_emb.inv_freq"};
    f.make_model = make_llama_model;
    return f;
  }();
  return spec;
}

}  // namespace scalelab
