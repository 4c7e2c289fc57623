#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"

namespace scalelab {

const char* family_name(ModelFamily f) { return f == ModelFamily::kLlama ? "llama" : "opt"; }

namespace {

using nlohmann::json;

std::int64_t require_int(const json& j, const char* key, const std::string& source) {
  if (!j.contains(key)) {
    throw InvalidInput("[config] " + source + " has no \"" + key +
                       "\" — add it (it is required to build the model)");
  }
  const auto& v = j.at(key);
  if (!v.is_number_integer()) {
    throw InvalidInput("[config] " + source + ": \"" + key + "\" must be an integer, got " + v.dump());
  }
  return v.get<std::int64_t>();
}

template <class T>
T get_or(const json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw InvalidInput("[config] " + source + ": \"" + key + "\" has the wrong type: " + j.at(key).dump());
  }
}

ModelConfig llama(std::string name, std::int64_t hidden, std::int64_t inter, std::int64_t layers,
                  std::int64_t heads, std::int64_t kv, std::int64_t vocab, std::int64_t max_pos, double theta,
                  bool tied, std::optional<RopeScaling> scaling, std::int64_t head_dim = 0) {
  ModelConfig c;
  c.family = ModelFamily::kLlama;
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
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.rope_scaling = scaling;
  return c;
}

ModelConfig opt(std::string name, std::int64_t hidden, std::int64_t ffn, std::int64_t layers, std::int64_t heads,
                std::int64_t vocab, std::int64_t max_pos, std::int64_t proj_dim, bool ln_before, double dropout) {
  ModelConfig c;
  c.family = ModelFamily::kOPT;
  c.name = std::move(name);
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = heads;
  c.head_dim = hidden / heads;
  c.vocab_size = vocab;
  c.max_position_embeddings = max_pos;
  c.word_embed_proj_dim = proj_dim;
  c.do_layer_norm_before = ln_before;
  c.dropout = dropout;
  c.tie_word_embeddings = true;
  c.pad_token_id = 1;
  return c;
}

const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> p = [] {
    std::map<std::string, ModelConfig> m;
    const RopeScaling s32{"llama3", 32.0, 1.0, 4.0, 8192};
    const RopeScaling s8{"llama3", 8.0, 1.0, 4.0, 8192};
    // Published shapes (meta-llama/Llama-3.2-1B, -3B, Llama-3.1-8B config.json).
    m["llama-3.2-1b"] = llama("llama-3.2-1b", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, true, s32, 64);
    m["llama-3.2-3b"] = llama("llama-3.2-3b", 3072, 8192, 28, 24, 8, 128256, 131072, 500000.0, true, s32, 128);
    m["llama-3.1-8b"] = llama("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, false, s8, 128);
    // Small models for this project's CPU benchmarks and tests.
    m["llama-small"] = llama("llama-small", 512, 2048, 8, 8, 2, 32768, 4096, 500000.0, true, std::nullopt);
    m["llama-tiny"] = llama("llama-tiny", 64, 128, 2, 4, 2, 256, 512, 10000.0, true, std::nullopt);
    // Published shapes (facebook/opt-125m, -350m, -1.3b config.json).
    m["opt-125m"] = opt("opt-125m", 768, 3072, 12, 12, 50272, 2048, 768, true, 0.1);
    m["opt-350m"] = opt("opt-350m", 1024, 4096, 24, 16, 50272, 2048, 512, false, 0.1);
    m["opt-1.3b"] = opt("opt-1.3b", 2048, 8192, 24, 32, 50272, 2048, 2048, true, 0.1);
    m["opt-small"] = opt("opt-small", 512, 2048, 8, 8, 32768, 2048, 512, true, 0.0);
    m["opt-tiny"] = opt("opt-tiny", 64, 128, 2, 4, 256, 512, 64, true, 0.0);
    return m;
  }();
  return p;
}

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& what) { throw InvalidInput("[config] " + source + ": " + what); };
  auto positive = [&](std::int64_t v, const char* field) {
    if (v <= 0) fail(std::string(field) + " must be positive, got " + std::to_string(v));
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, family == ModelFamily::kOPT ? "ffn_dim" : "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  if (family == ModelFamily::kOPT || head_dim * num_attention_heads == hidden_size) {
    if (hidden_size % num_attention_heads != 0) {
      fail("num_attention_heads (" + std::to_string(num_attention_heads) + ") does not divide hidden_size (" +
           std::to_string(hidden_size) + ") — choose a head count that divides it");
    }
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    fail("num_key_value_heads (" + std::to_string(num_key_value_heads) + ") does not divide num_attention_heads (" +
         std::to_string(num_attention_heads) + ") — grouped-query attention needs whole groups");
  }
  if (family == ModelFamily::kLlama && head_dim % 2 != 0) fail("head_dim must be even for RoPE");
  if (family == ModelFamily::kLlama && !(rms_norm_eps > 0)) fail("rms_norm_eps must be positive");
  if (family == ModelFamily::kLlama && !(rope_theta > 0)) fail("rope_theta must be positive");
  if (rope_scaling) {
    if (rope_scaling->rope_type != "llama3") {
      fail("rope_scaling type '" + rope_scaling->rope_type + "' is not supported — only \"llama3\"");
    }
    if (!(rope_scaling->factor > 0) || !(rope_scaling->high_freq_factor > rope_scaling->low_freq_factor) ||
        rope_scaling->original_max_position_embeddings <= 0) {
      fail("rope_scaling needs factor > 0, high_freq_factor > low_freq_factor and "
           "original_max_position_embeddings > 0");
    }
  }
  if (family == ModelFamily::kOPT) {
    positive(word_embed_proj_dim, "word_embed_proj_dim");
    if (activation_function != "relu" && activation_function != "gelu") {
      fail("activation_function '" + activation_function + "' is not supported — use relu or gelu");
    }
    if (dropout < 0 || dropout >= 1) fail("dropout must be in [0, 1)");
    if (pad_token_id && (*pad_token_id < 0 || *pad_token_id >= vocab_size)) {
      fail("pad_token_id " + std::to_string(*pad_token_id) + " is outside the vocabulary of " +
           std::to_string(vocab_size));
    }
  }
}

nlohmann::json ModelConfig::to_hf_json() const {
  json j;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["max_position_embeddings"] = max_position_embeddings;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = "float32";
  if (family == ModelFamily::kLlama) {
    j["model_type"] = "llama";
    j["architectures"] = json::array({"LlamaForCausalLM"});
    j["intermediate_size"] = intermediate_size;
    j["num_key_value_heads"] = num_key_value_heads;
    j["head_dim"] = head_dim;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = rms_norm_eps;
    j["rope_theta"] = rope_theta;
    j["initializer_range"] = initializer_range;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
    j["use_cache"] = true;
    if (rope_scaling) {
      j["rope_scaling"] = {{"rope_type", rope_scaling->rope_type},
                           {"factor", rope_scaling->factor},
                           {"low_freq_factor", rope_scaling->low_freq_factor},
                           {"high_freq_factor", rope_scaling->high_freq_factor},
                           {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
    } else {
      j["rope_scaling"] = nullptr;
    }
  } else {
    j["model_type"] = "opt";
    j["architectures"] = json::array({"OPTForCausalLM"});
    j["ffn_dim"] = intermediate_size;
    j["do_layer_norm_before"] = do_layer_norm_before;
    j["word_embed_proj_dim"] = word_embed_proj_dim;
    j["activation_function"] = activation_function;
    j["enable_bias"] = enable_bias;
    j["layer_norm_elementwise_affine"] = layer_norm_elementwise_affine;
    j["dropout"] = dropout;
    j["attention_dropout"] = 0.0;
    j["init_std"] = initializer_range;
    if (pad_token_id) j["pad_token_id"] = *pad_token_id;
    if (remove_final_layer_norm) j["_remove_final_layer_norm"] = true;
    j["bos_token_id"] = 2;
    j["eos_token_id"] = 2;
  }
  return j;
}

ModelConfig config_from_hf_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InvalidInput("[config] " + source + " is not a JSON object");
  ModelConfig c;
  c.name = source;
  const std::string type = get_or<std::string>(j, "model_type", "", source);
  if (type == "llama") {
    c.family = ModelFamily::kLlama;
    c.hidden_size = require_int(j, "hidden_size", source);
    c.intermediate_size = require_int(j, "intermediate_size", source);
    c.num_hidden_layers = require_int(j, "num_hidden_layers", source);
    c.num_attention_heads = require_int(j, "num_attention_heads", source);
    c.vocab_size = require_int(j, "vocab_size", source);
    // Optional fields take transformers' LlamaConfig defaults.
    c.num_key_value_heads = get_or<std::int64_t>(j, "num_key_value_heads", c.num_attention_heads, source);
    if (!j.contains("head_dim") || j.at("head_dim").is_null()) {
      // Without an explicit head_dim, heads must split hidden_size evenly.
      if (c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0) {
        throw InvalidInput("[config] " + source + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                           ") does not divide hidden_size (" + std::to_string(c.hidden_size) +
                           ") — choose a head count that divides it, or set head_dim");
      }
    }
    c.head_dim = get_or<std::int64_t>(j, "head_dim",
                                      c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0, source);
    c.max_position_embeddings = get_or<std::int64_t>(j, "max_position_embeddings", 2048, source);
    c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
    c.rope_theta = get_or<double>(j, "rope_theta", 10000.0, source);
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
    c.initializer_range = get_or<double>(j, "initializer_range", 0.02, source);
    const std::string act = get_or<std::string>(j, "hidden_act", "silu", source);
    if (act != "silu") throw InvalidInput("[config] " + source + ": hidden_act '" + act + "' is not supported — Llama uses silu");
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
      s.original_max_position_embeddings =
          get_or<std::int64_t>(r, "original_max_position_embeddings", 8192, source);
      c.rope_scaling = s;
    }
  } else if (type == "opt") {
    c.family = ModelFamily::kOPT;
    c.hidden_size = require_int(j, "hidden_size", source);
    c.intermediate_size = require_int(j, "ffn_dim", source);
    c.num_hidden_layers = require_int(j, "num_hidden_layers", source);
    c.num_attention_heads = require_int(j, "num_attention_heads", source);
    c.vocab_size = require_int(j, "vocab_size", source);
    c.num_key_value_heads = c.num_attention_heads;
    c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
    c.max_position_embeddings = get_or<std::int64_t>(j, "max_position_embeddings", 2048, source);
    c.do_layer_norm_before = get_or<bool>(j, "do_layer_norm_before", true, source);
    c.word_embed_proj_dim = get_or<std::int64_t>(j, "word_embed_proj_dim", c.hidden_size, source);
    c.activation_function = get_or<std::string>(j, "activation_function", "relu", source);
    c.enable_bias = get_or<bool>(j, "enable_bias", true, source);
    c.layer_norm_elementwise_affine = get_or<bool>(j, "layer_norm_elementwise_affine", true, source);
    c.dropout = get_or<double>(j, "dropout", 0.1, source);
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", true, source);
    c.initializer_range = get_or<double>(j, "init_std", 0.02, source);
    c.remove_final_layer_norm = get_or<bool>(j, "_remove_final_layer_norm", false, source);
    // OPTConfig's default pad_token_id is 1; an explicit null means no padding row.
    if (!j.contains("pad_token_id")) {
      c.pad_token_id = 1;
    } else if (!j.at("pad_token_id").is_null()) {
      c.pad_token_id = get_or<std::int64_t>(j, "pad_token_id", 1, source);
    }
    // Training-time features scalelab does not implement are refused rather than ignored.
    const double layerdrop = get_or<double>(j, "layerdrop", 0.0, source);
    if (layerdrop != 0.0) {
      throw InvalidInput("[config] " + source + ": layerdrop " + std::to_string(layerdrop) +
                         " is not supported — set \"layerdrop\": 0.0");
    }
    const double attn_dropout = get_or<double>(j, "attention_dropout", 0.0, source);
    if (attn_dropout != 0.0) {
      throw InvalidInput("[config] " + source + ": attention_dropout " + std::to_string(attn_dropout) +
                         " is not supported (flash attention never holds the probabilities to drop) — set "
                         "\"attention_dropout\": 0.0; \"dropout\" (residual dropout) is supported");
    }
  } else {
    throw InvalidInput("[config] " + source + ": model_type '" + type +
                       "' is not supported — scalelab trains \"llama\" and \"opt\" models");
  }
  c.validate(source);
  return c;
}

ModelConfig load_config_dir(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in) {
    throw InvalidInput("[config] cannot read " + path.string() +
                       " — --model takes a preset name (" + std::to_string(preset_names().size()) +
                       " known, e.g. llama-small) or a directory with a Hugging Face config.json");
  }
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw InvalidInput("[config] " + path.string() + " is not valid JSON: " + e.what());
  }
  ModelConfig c = config_from_hf_json(j, path.string());
  c.name = dir;
  return c;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

bool is_preset(const std::string& name) { return presets().count(name) != 0; }

ModelConfig preset_config(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string list;
    for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw InvalidInput("[config] unknown model preset '" + name + "' — known presets: " + list +
                       "; or give a directory with config.json");
  }
  return it->second;
}

ModelConfig resolve_model(const std::string& model) {
  if (is_preset(model)) return preset_config(model);
  if (std::filesystem::is_directory(model)) return load_config_dir(model);
  return preset_config(model);  // throws with the list of presets
}

}  // namespace scalelab
