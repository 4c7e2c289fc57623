#pragma once
// Parameter layout: where each named parameter (Hugging Face tensor name) lives in the one flat
// parameter buffer. Gradients, optimizer states and master weights use the same layout, so an
// optimizer is one loop and a gradient bucket is a slice.
//
// Llama layer order in the buffer: input_layernorm, q_proj, k_proj, v_proj (contiguous rows, so
// q/k/v are one GEMM with a [q_dim + 2*kv_dim, hidden] weight), o_proj, post_attention_layernorm,
// gate_proj, up_proj (contiguous: one [2*intermediate, hidden] GEMM), down_proj.
// OPT layer order: self_attn_layer_norm (w, b), q/k/v proj weights (contiguous) then q/k/v
// biases (contiguous), out_proj (w, b), final_layer_norm (w, b), fc1 (w, b), fc2 (w, b).
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace scalelab {

struct ParamInfo {
  std::string name;        // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;             // Hugging Face shape ([out, in] for linear weights)
  std::int64_t offset = 0; // in elements from the start of the flat buffer
  std::int64_t numel = 0;
  bool decay = true;       // weight decay applies (not to biases or norm weights, as HF Trainer)
  bool is_norm = false;    // a norm weight/bias: initialized to 1 (weight) or 0 (bias)
  bool is_bias = false;
  bool is_embedding = false;  // token or position embedding table
};

class ParamLayout {
 public:
  static ParamLayout build(const ModelConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  std::int64_t total_numel() const { return total_; }
  // nullptr when absent.
  const ParamInfo* find(const std::string& name) const;
  // Throws RuntimeError naming the parameter when absent (a bug in the model code).
  const ParamInfo& at(const std::string& name) const;
  // Number of parameters that take part in matmuls (every linear weight, including the LM head
  // whether tied or not, excluding embedding lookups, norms and biases): the N of 6·N FLOPs/token.
  std::int64_t matmul_numel() const { return matmul_numel_; }
  // Parameters excluding token/position embedding tables (Kaplan's non-embedding N).
  std::int64_t non_embedding_numel() const;

  // A view of one parameter inside a flat buffer of this layout.
  Tensor view(const Tensor& flat, const std::string& name) const;
  Tensor view(const Tensor& flat, const ParamInfo& p) const;

 private:
  void add(std::string name, Shape shape, bool decay, bool is_norm = false, bool is_bias = false,
           bool is_embedding = false);
  std::vector<ParamInfo> params_;
  std::int64_t total_ = 0;
  std::int64_t matmul_numel_ = 0;
};

// HF name prefixes, so model code and checkpoint code agree.
std::string llama_layer_prefix(std::int64_t layer);  // "model.layers.<i>."
std::string opt_layer_prefix(std::int64_t layer);    // "model.decoder.layers.<i>."

}  // namespace scalelab
