#pragma once
// Model families: one descriptor per family (src/model/<family>/family.cpp) and the registry that
// lists them. Everything the generic code (config, params, checkpoint, init, model, trainer)
// needs to know about a family is asked here; nothing outside src/model/<family>/ branches on it.
// docs/adding-a-model.md walks through adding one.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

namespace scalelab {

struct ModelFamilySpec {
  ModelFamily id = ModelFamily::kLlama;
  std::string name;          // "llama": the run record's model_family, family_name()
  std::string display_name;  // "Llama": error messages
  std::vector<std::string> hf_model_types;  // config.json "model_type" values it reads ({"llama"})
  // Named presets with their published (or this project's test) shapes; family and name set.
  std::vector<ModelConfig> presets;

  // config.json -> ModelConfig: the family's keys, HF defaults for the optional ones, and a refusal
  // (InvalidInput naming `source`) of features scalelab does not implement. The registry sets
  // family and name and calls ModelConfig::validate afterwards.
  std::function<ModelConfig(const nlohmann::json& j, const std::string& source)> config_from_hf;
  // Adds the family's keys (model_type, architectures, ...) to `j`, which already holds the shared
  // ones (vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
  // max_position_embeddings, tie_word_embeddings, torch_dtype).
  std::function<void(const ModelConfig& c, nlohmann::json& j)> config_to_hf;
  // The family's own checks, after the shared ones of ModelConfig::validate; `fail(what)` throws
  // InvalidInput "[config] <source>: <what>".
  std::function<void(const ModelConfig& c, const std::function<void(const std::string&)>& fail)> validate;
  // HF key of intermediate_size ("ffn_dim" for OPT): errors and describe_config name it.
  std::string intermediate_key = "intermediate_size";
  // head_dim may differ from hidden_size / num_attention_heads (Llama's config.json "head_dim");
  // when false, the heads must divide hidden_size.
  bool explicit_head_dim = false;
  // The shape-defining fields beyond the shared ones, for error messages (", head_dim 16").
  std::function<std::string(const ModelConfig& c)> describe;

  // Appends the parameters in buffer order: HF names and shapes, so the layout is also the
  // checkpoint's name map. Fused views (q/k/v, gate/up) are contiguous runs of it.
  std::function<void(const ModelConfig& c, ParamLayout& layout)> build_layout;
  // The token embedding's name; a tied checkpoint's lm_head.weight must equal it.
  std::string token_embedding;
  // The name prefix of decoder layer `layer`'s parameters ("model.layers.3."): what the model's
  // per-layer grad-ready ranges cover (--optimizer-in-backward shares one gradient slot over them).
  std::function<std::string(std::int64_t layer)> layer_prefix;
  // The token embedding honours config.pad_token_id as torch's padding_idx (zero row at init, no
  // gradient from lookups of that id).
  bool embedding_padding_idx = false;
  // Checkpoint tensors with these name endings are buffers, not parameters: skipped on load.
  std::vector<std::string> ignored_tensor_suffixes;

  // Switches. `dropout`: the family has residual dropout (--dropout, config "dropout"); the
  // others refuse a positive --dropout. `check_options`: the family's own switch checks (OPT:
  // --fused-kernels needs relu); InvalidInput naming the flag.
  bool dropout = false;
  std::function<void(const ModelConfig& c, const ModelOptions& o)> check_options;

  std::function<std::unique_ptr<Model>(const ModelConfig& c, const ParamLayout& layout, Tensor& params,
                                       Tensor& grads, const ModelOptions& o)>
      make_model;
};

// Every registered family, in registration order (src/model/family.cpp).
const std::vector<const ModelFamilySpec*>& model_families();
const ModelFamilySpec& family_spec(ModelFamily id);
// nullptr when no family reads that model_type / has that name / that preset.
const ModelFamilySpec* find_family_by_hf_type(const std::string& model_type);
const ModelFamilySpec* find_family_by_name(const std::string& name);
const ModelFamilySpec* find_family_by_preset(const std::string& preset);
inline const ModelFamilySpec& family_of(const ModelConfig& c) { return family_spec(c.family); }

}  // namespace scalelab
