#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "model/gguf_model.h"
#include "model/family.h"
#include "model/hf_json.h"

namespace scalelab {

namespace hf_json {

std::int64_t require_int(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key)) {
    throw InvalidInput("[config] " + source + " has no \"" + key + "\" — add it (it is required to build the model)");
  }
  const auto& v = j.at(key);
  if (!v.is_number_integer()) {
    throw InvalidInput("[config] " + source + ": \"" + key + "\" must be an integer, got " + v.dump());
  }
  return v.get<std::int64_t>();
}

void fail(const std::string& source, const std::string& what) { throw InvalidInput("[config] " + source + ": " + what); }

}  // namespace hf_json

namespace {

using nlohmann::json;

// Every family's presets by name (sorted, as preset_names() lists them).
const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> p = [] {
    std::map<std::string, ModelConfig> m;
    for (const ModelFamilySpec* f : model_families())
      for (const ModelConfig& c : f->presets) m[c.name] = c;
    return m;
  }();
  return p;
}

}  // namespace

void ModelConfig::validate(const std::string& source) const {
  const ModelFamilySpec& f = family_of(*this);
  auto fail = [&](const std::string& what) { hf_json::fail(source, what); };
  auto positive = [&](std::int64_t v, const char* field) {
    if (v <= 0) fail(std::string(field) + " must be positive, got " + std::to_string(v));
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, f.intermediate_key.c_str());
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  // Upper bounds far above any published model (Llama 3.1 405B: hidden 16384, intermediate 53248,
  // 126 layers, 128 heads, a vocabulary of 128256, 131072 positions), so that every size derived
  // from them (parameter counts, tensor sizes, the plan's bytes) fits in 64 bits, and an absurd
  // config.json is refused rather than overflowing or allocating without bound (found by fuzzing).
  auto at_most = [&](std::int64_t v, std::int64_t limit, const std::string& field) {
    if (v > limit) {
      fail(field + " " + std::to_string(v) + " is above the largest scalelab accepts (" + std::to_string(limit) +
           ") — the config.json is corrupt or not a language model's");
    }
  };
  at_most(hidden_size, kMaxModelWidth, "hidden_size");
  at_most(intermediate_size, kMaxModelWidth, f.intermediate_key);
  at_most(num_hidden_layers, kMaxModelLayers, "num_hidden_layers");
  at_most(num_attention_heads, kMaxModelHeads, "num_attention_heads");
  at_most(num_key_value_heads, kMaxModelHeads, "num_key_value_heads");
  at_most(head_dim, kMaxModelWidth, "head_dim");
  at_most(vocab_size, kMaxModelVocab, "vocab_size");
  at_most(max_position_embeddings, kMaxModelPositions, "max_position_embeddings");
  if (!f.explicit_head_dim || head_dim * num_attention_heads == hidden_size) {
    if (hidden_size % num_attention_heads != 0) {
      fail("num_attention_heads (" + std::to_string(num_attention_heads) + ") does not divide hidden_size (" +
           std::to_string(hidden_size) + ") — choose a head count that divides it");
    }
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    fail("num_key_value_heads (" + std::to_string(num_key_value_heads) + ") does not divide num_attention_heads (" +
         std::to_string(num_attention_heads) + ") — grouped-query attention needs whole groups");
  }
  if (f.validate) f.validate(*this, fail);
  if (f.embedding_padding_idx && pad_token_id && (*pad_token_id < 0 || *pad_token_id >= vocab_size)) {
    fail("pad_token_id " + std::to_string(*pad_token_id) + " is outside the vocabulary of " +
         std::to_string(vocab_size));
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
  family_of(*this).config_to_hf(*this, j);
  return j;
}

ModelConfig config_from_hf_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InvalidInput("[config] " + source + " is not a JSON object");
  const std::string type = hf_json::get_or<std::string>(j, "model_type", "", source);
  const ModelFamilySpec* f = find_family_by_hf_type(type);
  if (f == nullptr) {
    std::string known;
    for (const ModelFamilySpec* g : model_families())
      for (const auto& t : g->hf_model_types) known += (known.empty() ? "\"" : ", \"") + t + "\"";
    throw InvalidInput("[config] " + source + ": model_type '" + type + "' is not supported — scalelab trains " +
                       known + " models");
  }
  ModelConfig c = f->config_from_hf(j, source);
  c.family = f->id;
  c.name = source;
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
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number beyond double's range ("1e999").
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
  if (is_gguf_path(model)) return config_from_gguf(model);
  return preset_config(model);  // throws with the list of presets
}

}  // namespace scalelab
