#include "model/params.h"

#include "core/error.h"

namespace scalelab {

std::string llama_layer_prefix(std::int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }
std::string opt_layer_prefix(std::int64_t layer) { return "model.decoder.layers." + std::to_string(layer) + "."; }

void ParamLayout::add(std::string name, Shape shape, bool decay, bool is_norm, bool is_bias, bool is_embedding) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = shape;
  p.offset = total_;
  p.numel = shape.numel();
  p.decay = decay;
  p.is_norm = is_norm;
  p.is_bias = is_bias;
  p.is_embedding = is_embedding;
  total_ += p.numel;
  params_.push_back(std::move(p));
}

ParamLayout ParamLayout::build(const ModelConfig& c) {
  ParamLayout L;
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const std::int64_t Q = c.q_dim(), KV = c.kv_dim();
  if (c.family == ModelFamily::kLlama) {
    L.add("model.embed_tokens.weight", {V, H}, true, false, false, true);
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = llama_layer_prefix(l);
      L.add(p + "input_layernorm.weight", {H}, false, true);
      L.add(p + "self_attn.q_proj.weight", {Q, H}, true);
      L.add(p + "self_attn.k_proj.weight", {KV, H}, true);
      L.add(p + "self_attn.v_proj.weight", {KV, H}, true);
      L.add(p + "self_attn.o_proj.weight", {H, Q}, true);
      L.add(p + "post_attention_layernorm.weight", {H}, false, true);
      L.add(p + "mlp.gate_proj.weight", {I, H}, true);
      L.add(p + "mlp.up_proj.weight", {I, H}, true);
      L.add(p + "mlp.down_proj.weight", {H, I}, true);
      L.matmul_numel_ += (Q + 2 * KV) * H + H * Q + 3 * I * H;
    }
    L.add("model.norm.weight", {H}, false, true);
    if (!c.tie_word_embeddings) L.add("lm_head.weight", {V, H}, true);
    L.matmul_numel_ += V * H;
  } else {
    const std::int64_t P = c.word_embed_proj_dim;
    const bool affine = c.layer_norm_elementwise_affine;
    const bool bias = c.enable_bias;
    L.add("model.decoder.embed_tokens.weight", {V, P}, true, false, false, true);
    // OPT's learned positions have an offset of 2 (rows 0 and 1 are never used by positions).
    L.add("model.decoder.embed_positions.weight", {c.max_position_embeddings + 2, H}, true, false, false, true);
    if (P != H) {
      L.add("model.decoder.project_in.weight", {H, P}, true);
      L.matmul_numel_ += H * P;
    }
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = opt_layer_prefix(l);
      if (affine) {
        L.add(p + "self_attn_layer_norm.weight", {H}, false, true);
        L.add(p + "self_attn_layer_norm.bias", {H}, false, true, true);
      }
      L.add(p + "self_attn.q_proj.weight", {H, H}, true);
      L.add(p + "self_attn.k_proj.weight", {H, H}, true);
      L.add(p + "self_attn.v_proj.weight", {H, H}, true);
      if (bias) {
        L.add(p + "self_attn.q_proj.bias", {H}, false, false, true);
        L.add(p + "self_attn.k_proj.bias", {H}, false, false, true);
        L.add(p + "self_attn.v_proj.bias", {H}, false, false, true);
      }
      L.add(p + "self_attn.out_proj.weight", {H, H}, true);
      if (bias) L.add(p + "self_attn.out_proj.bias", {H}, false, false, true);
      if (affine) {
        L.add(p + "final_layer_norm.weight", {H}, false, true);
        L.add(p + "final_layer_norm.bias", {H}, false, true, true);
      }
      L.add(p + "fc1.weight", {I, H}, true);
      if (bias) L.add(p + "fc1.bias", {I}, false, false, true);
      L.add(p + "fc2.weight", {H, I}, true);
      if (bias) L.add(p + "fc2.bias", {H}, false, false, true);
      L.matmul_numel_ += 4 * H * H + 2 * H * I;
    }
    if (c.has_final_layer_norm() && affine) {
      L.add("model.decoder.final_layer_norm.weight", {H}, false, true);
      L.add("model.decoder.final_layer_norm.bias", {H}, false, true, true);
    }
    if (P != H) {
      L.add("model.decoder.project_out.weight", {P, H}, true);
      L.matmul_numel_ += H * P;
    }
    if (!c.tie_word_embeddings) L.add("lm_head.weight", {V, P}, true);
    L.matmul_numel_ += V * P;
  }
  return L;
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParamLayout::at(const std::string& name) const {
  const ParamInfo* p = find(name);
  SCALELAB_CHECK(p != nullptr, "[params] no parameter named '" + name + "' in this model");
  return *p;
}

std::int64_t ParamLayout::non_embedding_numel() const {
  std::int64_t n = 0;
  for (const auto& p : params_)
    if (!p.is_embedding) n += p.numel;
  return n;
}

Tensor ParamLayout::view(const Tensor& flat, const ParamInfo& p) const {
  return flat.view({flat.numel()}).slice(p.offset, p.offset + p.numel).view(p.shape);
}

Tensor ParamLayout::view(const Tensor& flat, const std::string& name) const { return view(flat, at(name)); }

}  // namespace scalelab
