// The Llama family's descriptor (Llama 3.x): presets, config.json in/out, checks, layout.
#include "core/error.h"
#include "model/family.h"
#include "model/hf_json.h"
#include "model/llama/llama.h"

namespace scalelab {

using nlohmann::json;
using hf_json::get_or;
using hf_json::require_int;

std::string llama_layer_prefix(std::int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

ModelConfig llama_like_preset(ModelFamily family, std::string name, std::int64_t hidden, std::int64_t inter,
                              std::int64_t layers, std::int64_t heads, std::int64_t kv, std::int64_t vocab,
                              std::int64_t max_pos, double theta, double rms_norm_eps, bool tied,
                              std::int64_t head_dim) {
  ModelConfig c;
  c.family = family;
  c.name = std::move(name);
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv;
  c.head_dim = head_dim ? head_dim : hidden / heads;
  c.vocab_size = vocab;
  c.max_position_embeddings = max_pos;
  c.rope_theta = theta;
  c.rms_norm_eps = rms_norm_eps;
  c.tie_word_embeddings = tied;
  return c;
}

ModelConfig llama_like_from_hf(const json& j, const std::string& source, std::int64_t default_max_position_embeddings,
                               const std::string& display_name) {
  ModelConfig c;
  c.hidden_size = require_int(j, "hidden_size", source);
  c.intermediate_size = require_int(j, "intermediate_size", source);
  c.num_hidden_layers = require_int(j, "num_hidden_layers", source);
  c.num_attention_heads = require_int(j, "num_attention_heads", source);
  c.vocab_size = require_int(j, "vocab_size", source);
  // Optional fields take transformers' defaults.
  c.num_key_value_heads = get_or<std::int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
  if (!j.contains("head_dim") || j.at("head_dim").is_null()) {
    // Without an explicit head_dim, heads must split hidden_size evenly.
    if (c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0) {
      throw InvalidInput("[config] " + source + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                         ") does not divide hidden_size (" + std::to_string(c.hidden_size) +
                         ") — choose a head count that divides it, or set head_dim");
    }
  }
  c.head_dim = get_or<std::int64_t>(j, "head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0,
                                    source);
  c.max_position_embeddings = get_or<std::int64_t>(j, "max_position_embeddings", default_max_position_embeddings, source);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
  c.rope_theta = get_or<double>(j, "rope_theta", 10000.0, source);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
  c.initializer_range = get_or<double>(j, "initializer_range", 0.02, source);
  const std::string act = get_or<std::string>(j, "hidden_act", "silu", source);
  if (act != "silu") {
    throw InvalidInput("[config] " + source + ": hidden_act '" + act + "' is not supported — " + display_name +
                       " uses silu");
  }
  return c;
}

void llama_like_to_hf(const ModelConfig& c, json& j) {
  j["intermediate_size"] = c.intermediate_size;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["initializer_range"] = c.initializer_range;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
}

void validate_llama_like(const ModelConfig& c, const std::function<void(const std::string&)>& fail) {
  if (c.head_dim % 2 != 0) fail("head_dim must be even for RoPE");
  if (!(c.rms_norm_eps > 0)) fail("rms_norm_eps must be positive");
  if (!(c.rope_theta > 0)) fail("rope_theta must be positive");
}

std::string describe_llama_like(const ModelConfig& c) {
  return ", num_key_value_heads " + std::to_string(c.num_key_value_heads) + ", head_dim " + std::to_string(c.head_dim);
}

void build_llama_layout(const ModelConfig& c, ParamLayout& L) {
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const std::int64_t Q = c.q_dim(), KV = c.kv_dim();
  L.add("model.embed_tokens.weight", {V, H}, ParamKind::kEmbedding);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = llama_layer_prefix(l);
    L.add(p + "input_layernorm.weight", {H}, ParamKind::kNormWeight);
    L.add(p + "self_attn.q_proj.weight", {Q, H}, ParamKind::kLinear);
    L.add(p + "self_attn.k_proj.weight", {KV, H}, ParamKind::kLinear);
    L.add(p + "self_attn.v_proj.weight", {KV, H}, ParamKind::kLinear);
    if (c.qkv_bias) {
      L.add(p + "self_attn.q_proj.bias", {Q}, ParamKind::kBias);
      L.add(p + "self_attn.k_proj.bias", {KV}, ParamKind::kBias);
      L.add(p + "self_attn.v_proj.bias", {KV}, ParamKind::kBias);
    }
    L.add(p + "self_attn.o_proj.weight", {H, Q}, ParamKind::kLinear);
    L.add(p + "post_attention_layernorm.weight", {H}, ParamKind::kNormWeight);
    L.add(p + "mlp.gate_proj.weight", {I, H}, ParamKind::kLinear);
    L.add(p + "mlp.up_proj.weight", {I, H}, ParamKind::kLinear);
    L.add(p + "mlp.down_proj.weight", {H, I}, ParamKind::kLinear);
  }
  L.add("model.norm.weight", {H}, ParamKind::kNormWeight);
  if (c.tie_word_embeddings) {
    L.add_matmul_numel(V * H);  // the LM head reads the embedding
  } else {
    L.add("lm_head.weight", {V, H}, ParamKind::kLinear);
  }
}

namespace {

ModelConfig llama_preset(std::string name, std::int64_t hidden, std::int64_t inter, std::int64_t layers,
                         std::int64_t heads, std::int64_t kv, std::int64_t vocab, std::int64_t max_pos, double theta,
                         bool tied, std::optional<RopeScaling> scaling, std::int64_t head_dim = 0) {
  ModelConfig c = llama_like_preset(ModelFamily::kLlama, std::move(name), hidden, inter, layers, heads, kv, vocab,
                                    max_pos, theta, 1e-5, tied, head_dim);
  c.rope_scaling = scaling;
  return c;
}

std::vector<ModelConfig> presets() {
  const RopeScaling s32{"llama3", 32.0, 1.0, 4.0, 8192};
  const RopeScaling s8{"llama3", 8.0, 1.0, 4.0, 8192};
  return {
      // Published shapes (meta-llama/Llama-3.2-1B, -3B, Llama-3.1-8B config.json).
      llama_preset("llama-3.2-1b", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, true, s32, 64),
      llama_preset("llama-3.2-3b", 3072, 8192, 28, 24, 8, 128256, 131072, 500000.0, true, s32, 128),
      llama_preset("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, false, s8, 128),
      // Small models for this project's CPU benchmarks and tests.
      llama_preset("llama-small", 512, 2048, 8, 8, 2, 32768, 4096, 500000.0, true, std::nullopt),
      llama_preset("llama-tiny", 64, 128, 2, 4, 2, 256, 512, 10000.0, true, std::nullopt),
  };
}

ModelConfig from_hf(const json& j, const std::string& source) {
  ModelConfig c = llama_like_from_hf(j, source, 2048, "Llama");
  if (get_or<bool>(j, "attention_bias", false, source) || get_or<bool>(j, "mlp_bias", false, source)) {
    throw InvalidInput("[config] " + source + ": attention_bias / mlp_bias are not supported for Llama — set them false");
  }
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
    const auto& r = j.at("rope_scaling");
    RopeScaling s;
    s.rope_type = get_or<std::string>(r, "rope_type", get_or<std::string>(r, "type", "", source), source);
    s.factor = get_or<double>(r, "factor", 8.0, source);
    s.low_freq_factor = get_or<double>(r, "low_freq_factor", 1.0, source);
    s.high_freq_factor = get_or<double>(r, "high_freq_factor", 4.0, source);
    s.original_max_position_embeddings = get_or<std::int64_t>(r, "original_max_position_embeddings", 8192, source);
    c.rope_scaling = s;
  }
  return c;
}

void to_hf(const ModelConfig& c, json& j) {
  llama_like_to_hf(c, j);
  j["model_type"] = "llama";
  j["architectures"] = json::array({"LlamaForCausalLM"});
  j["head_dim"] = c.head_dim;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    j["rope_scaling"] = {{"rope_type", s.rope_type},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
}

void validate(const ModelConfig& c, const std::function<void(const std::string&)>& fail) {
  validate_llama_like(c, fail);
  if (c.qkv_bias) fail("q/k/v biases are not part of Llama — set qkv_bias false (Qwen2 has them)");
  if (c.rope_scaling) {
    const RopeScaling& s = *c.rope_scaling;
    if (s.rope_type != "llama3") fail("rope_scaling type '" + s.rope_type + "' is not supported — only \"llama3\"");
    if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position_embeddings <= 0) {
      fail("rope_scaling needs factor > 0, high_freq_factor > low_freq_factor and "
           "original_max_position_embeddings > 0");
    }
  }
}

}  // namespace

const ModelFamilySpec& llama_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec f;
    f.id = ModelFamily::kLlama;
    f.name = "llama";
    f.display_name = "Llama";
    f.hf_model_types = {"llama"};
    f.presets = presets();
    f.config_from_hf = from_hf;
    f.config_to_hf = to_hf;
    f.validate = validate;
    f.explicit_head_dim = true;
    f.describe = describe_llama_like;
    f.build_layout = build_llama_layout;
    f.layer_prefix = llama_layer_prefix;
    f.token_embedding = "model.embed_tokens.weight";
    f.ignored_tensor_suffixes = {".rotary_emb.inv_freq"};
    f.make_model = make_llama_model;
    return f;
  }();
  return spec;
}

}  // namespace scalelab
