// The OPT family's descriptor (transformers' OPTForCausalLM): presets, config.json in/out,
// checks, layout, switches.
#include "core/error.h"
#include "model/family.h"
#include "model/hf_json.h"
#include "model/opt/opt.h"

namespace scalelab {

using nlohmann::json;
using hf_json::get_or;
using hf_json::require_int;

std::string opt_layer_prefix(std::int64_t layer) { return "model.decoder.layers." + std::to_string(layer) + "."; }

namespace {

ModelConfig opt_preset(std::string name, std::int64_t hidden, std::int64_t ffn, std::int64_t layers,
                       std::int64_t heads, std::int64_t vocab, std::int64_t max_pos, std::int64_t proj_dim,
                       bool ln_before, double dropout) {
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

std::vector<ModelConfig> presets() {
  return {
      // Published shapes (facebook/opt-125m, -350m, -1.3b config.json).
      opt_preset("opt-125m", 768, 3072, 12, 12, 50272, 2048, 768, true, 0.1),
      opt_preset("opt-350m", 1024, 4096, 24, 16, 50272, 2048, 512, false, 0.1),
      opt_preset("opt-1.3b", 2048, 8192, 24, 32, 50272, 2048, 2048, true, 0.1),
      // Small models for this project's CPU benchmarks and tests.
      opt_preset("opt-small", 512, 2048, 8, 8, 32768, 2048, 512, true, 0.0),
      opt_preset("opt-tiny", 64, 128, 2, 4, 256, 512, 64, true, 0.0),
  };
}

ModelConfig from_hf(const json& j, const std::string& source) {
  ModelConfig c;
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
  return c;
}

void to_hf(const ModelConfig& c, json& j) {
  j["model_type"] = "opt";
  j["architectures"] = json::array({"OPTForCausalLM"});
  j["ffn_dim"] = c.intermediate_size;
  j["do_layer_norm_before"] = c.do_layer_norm_before;
  j["word_embed_proj_dim"] = c.word_embed_proj_dim;
  j["activation_function"] = c.activation_function;
  j["enable_bias"] = c.enable_bias;
  j["layer_norm_elementwise_affine"] = c.layer_norm_elementwise_affine;
  j["dropout"] = c.dropout;
  j["attention_dropout"] = 0.0;
  j["init_std"] = c.initializer_range;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  if (c.remove_final_layer_norm) j["_remove_final_layer_norm"] = true;
  j["bos_token_id"] = 2;
  j["eos_token_id"] = 2;
}

void validate(const ModelConfig& c, const std::function<void(const std::string&)>& fail) {
  if (c.word_embed_proj_dim <= 0 || c.word_embed_proj_dim > kMaxModelWidth) {
    fail("word_embed_proj_dim must be in [1, " + std::to_string(kMaxModelWidth) + "], got " +
         std::to_string(c.word_embed_proj_dim));
  }
  if (c.activation_function != "relu" && c.activation_function != "gelu") {
    fail("activation_function '" + c.activation_function + "' is not supported — use relu or gelu");
  }
  if (c.dropout < 0 || c.dropout >= 1) fail("dropout must be in [0, 1)");
}

std::string describe(const ModelConfig& c) {
  return ", word_embed_proj_dim " + std::to_string(c.word_embed_proj_dim) + ", max_position_embeddings " +
         std::to_string(c.max_position_embeddings) + ", do_layer_norm_before " +
         (c.do_layer_norm_before ? "true" : "false");
}

// Buffer order: embed_tokens, embed_positions, project_in; per layer self_attn_layer_norm (w, b),
// q/k/v proj weights (adjacent) then q/k/v biases (adjacent), out_proj (w, b), final_layer_norm
// (w, b), fc1 (w, b), fc2 (w, b); the decoder's final_layer_norm; project_out; lm_head when untied.
void build_layout(const ModelConfig& c, ParamLayout& L) {
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, P = c.word_embed_proj_dim;
  const bool affine = c.layer_norm_elementwise_affine;
  const bool bias = c.enable_bias;
  L.add("model.decoder.embed_tokens.weight", {V, P}, ParamKind::kEmbedding);
  // OPT's learned positions have an offset of 2 (rows 0 and 1 are never used by positions).
  L.add("model.decoder.embed_positions.weight", {c.max_position_embeddings + 2, H}, ParamKind::kEmbedding);
  if (P != H) L.add("model.decoder.project_in.weight", {H, P}, ParamKind::kLinear);
  auto norm = [&](const std::string& name) {
    if (!affine) return;
    L.add(name + ".weight", {H}, ParamKind::kNormWeight);
    L.add(name + ".bias", {H}, ParamKind::kNormBias);
  };
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = opt_layer_prefix(l);
    norm(p + "self_attn_layer_norm");
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) L.add(p + "self_attn." + n + ".weight", {H, H}, ParamKind::kLinear);
    if (bias)
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) L.add(p + "self_attn." + n + ".bias", {H}, ParamKind::kBias);
    L.add(p + "self_attn.out_proj.weight", {H, H}, ParamKind::kLinear);
    if (bias) L.add(p + "self_attn.out_proj.bias", {H}, ParamKind::kBias);
    norm(p + "final_layer_norm");
    L.add(p + "fc1.weight", {I, H}, ParamKind::kLinear);
    if (bias) L.add(p + "fc1.bias", {I}, ParamKind::kBias);
    L.add(p + "fc2.weight", {H, I}, ParamKind::kLinear);
    if (bias) L.add(p + "fc2.bias", {H}, ParamKind::kBias);
  }
  if (c.has_final_layer_norm()) norm("model.decoder.final_layer_norm");
  if (P != H) L.add("model.decoder.project_out.weight", {P, H}, ParamKind::kLinear);
  if (c.tie_word_embeddings) {
    L.add_matmul_numel(V * P);  // the LM head reads the embedding
  } else {
    L.add("lm_head.weight", {V, P}, ParamKind::kLinear);
  }
}

void check_options(const ModelConfig& c, const ModelOptions& o) {
  if (o.fused_kernels && c.activation_function != "relu") {
    throw InvalidInput("[--fused-kernels] the fused OPT MLP is bias+ReLU; this model's activation_function is '" +
                       c.activation_function + "' — run without --fused-kernels");
  }
}

}  // namespace

const ModelFamilySpec& opt_family() {
  static const ModelFamilySpec spec = [] {
    ModelFamilySpec f;
    f.id = ModelFamily::kOPT;
    f.name = "opt";
    f.display_name = "OPT";
    f.hf_model_types = {"opt"};
    f.presets = presets();
    f.config_from_hf = from_hf;
    f.config_to_hf = to_hf;
    f.validate = validate;
    f.intermediate_key = "ffn_dim";
    f.describe = describe;
    f.build_layout = build_layout;
    f.layer_prefix = opt_layer_prefix;
    f.token_embedding = "model.decoder.embed_tokens.weight";
    f.embedding_padding_idx = true;
    f.dropout = true;
    f.check_options = check_options;
    f.make_model = make_opt_model;
    return f;
  }();
  return spec;
}

}  // namespace scalelab
