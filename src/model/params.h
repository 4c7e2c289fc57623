#pragma once
// Parameter layout: where each named parameter (Hugging Face tensor name) lives in the one flat
// parameter buffer. Gradients, optimizer states and master weights use the same layout, so an
// optimizer is one loop and a gradient bucket is a slice.
//
// Trainable and frozen parameters (--freeze, ParamLayout::freeze): the one parameter buffer is laid
// out with every trainable parameter first, in the family's order, then every frozen one in the
// same order. The trainable part [0, trainable_numel()) is the "trainable buffer": gradients,
// AdamW states (and their ZeRO-1 shards), the fp32 master update, clipping's sum of squares and
// the DDP buckets are buffers of trainable_numel() elements with the same offsets, so a trainable
// parameter's offset is its place in all of them; a frozen parameter has no gradient and no state.
// The frozen part [trainable_numel(), total_numel()) is the "frozen buffer": read by forward and
// backward, never written after loading. A family's runs stay runs (a layer's trainable
// parameters are adjacent, fused q/k/v and gate/up stay adjacent when all are frozen or none)
// because the order within each part is the family's. Without --freeze everything is trainable
// and the layout is the family's, unchanged.
//
// Each family's descriptor builds its layout (ModelFamilySpec::build_layout,
// src/model/<family>/family.cpp, where the order of each family's buffer is written down); the
// parameters a fused GEMM reads as one matrix (q/k/v, gate/up) are adjacent.
#include <cstdint>
#include <memory>
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
  bool trainable = true;      // false: frozen (--freeze): no gradient, no optimizer state
  bool is_adapter = false;    // a LoRA matrix (--lora-rank): not in the base checkpoint
  bool quantized = false;     // QLoRA (--quantize-base): stored in NF4 (model/nf4.h), not in the flat buffer
};

// LoRA (--lora-rank R, --lora-alpha A, --lora-targets, --rslora), as peft's LoraConfig: each
// targeted linear module gets lora_A [r, in] and lora_B [out, r] and computes
// y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ with s = alpha/r (alpha/√r with rslora); every base parameter is frozen.
struct LoraConfig {
  std::int64_t rank = 0;  // 0: no LoRA
  double alpha = 8.0;     // peft's default lora_alpha
  double dropout = 0.0;   // lora_dropout: on the adapter input while training (model/decoder/lora.h)
  std::vector<std::string> targets;  // module names (suffixes of the module path); empty: q_proj, v_proj
  bool rslora = false;
  // QLoRA (--quantize-base): "" (none), "nf4" (torchao's to_nf4) or "nf4-bnb" (bitsandbytes'):
  // every linear weight of the decoder layers is stored in NF4 (model/nf4.h).
  std::string quantize_base;
  bool enabled() const { return rank > 0; }
  double scale() const;
  // peft's defaults when no --lora-targets is given (its Llama/OPT/Qwen2 mapping).
  std::vector<std::string> resolved_targets() const;
};

// Quantization-aware training (--qat 8da4w, --qat-group-size G), as torchao's
// Int8DynActInt4WeightQATQuantizer: every linear module of the decoder layers computes
// y = fq8(x)·fq4(W)ᵀ (+ b) with int8 dynamic per-token activations and int4 grouped symmetric
// weights (model/decoder/qat.h, kernels/qat.h); the LM head, embeddings and norms stay as they are.
struct QatConfig {
  std::string scheme;            // "" (off) or "8da4w"
  std::int64_t group_size = 256;  // torchao's default groupsize
  bool enabled() const { return !scheme.empty(); }
};

// What a parameter is, which sets its flags: linear weights and embeddings decay, norm weights
// and biases do not (as the HF Trainer); norms initialize to 1 (weight) or 0 (bias), biases to 0.
// kAdapter: a LoRA matrix (decays like a linear weight, not counted in matmul_numel()).
enum class ParamKind { kLinear, kEmbedding, kNormWeight, kNormBias, kBias, kAdapter };

class Nf4Store;  // model/nf4.h

class ParamLayout {
 public:
  // The layout of config.family (its descriptor's build_layout).
  static ParamLayout build(const ModelConfig& config);
  // The same with the parameters whose name matches `freeze_regex` frozen (freeze()); empty: none.
  // With lora.enabled(): the LoRA adapters added and the base frozen (add_lora()).
  static ParamLayout build(const ModelConfig& config, const std::string& freeze_regex,
                           const LoraConfig& lora = {});

  // Freezes every parameter whose Hugging Face name matches `regex` (std::regex ECMAScript,
  // std::regex_search: a match anywhere in the name, e.g. "embed_tokens" or "layers\.[0-5]\.")
  // and lays the buffer out again, trainable parameters first (see above). Call it after the
  // last add(). Throws InvalidInput naming --freeze when the regex is not valid, matches no
  // parameter, or matches every parameter (nothing would train).
  void freeze(const std::string& regex);

  // LoRA: appends, layer by layer, "<module>.lora_A.weight" [r, in] and "<module>.lora_B.weight"
  // [out, r] for every linear weight "<module>.weight" of a decoder layer whose module name
  // (the last part of the path) is one of lora.resolved_targets(), then freezes every other
  // parameter (the adapters are the trainable buffer). Call it after the last add(), instead of
  // freeze(). Throws InvalidInput naming --lora-targets when a target matches no module (listing
  // the modules that exist) and --lora-rank when the rank is above a targeted matrix's dimension.
  void add_lora(const LoraConfig& lora);
  // The LoRA settings (rank 0: none).
  const LoraConfig& lora() const { return lora_; }

  // QLoRA (lora.quantize_base, applied by add_lora): the quantized parameters (ParamInfo::quantized,
  // every frozen linear weight of the decoder layers) are laid out last, after the dense frozen
  // ones, and are not in the flat buffers: a parameter buffer holds dense_numel() elements, the
  // quantized weights live in an Nf4Store that the run attaches (attach_nf4) before it builds the
  // model; bind_linear reads them from it. Throws InvalidInput naming --quantize-base and the
  // tensor when a weight's size is one the flavour refuses (model/nf4.h, nf4_refusal).
  std::int64_t quantized_numel() const { return total_ - dense_; }
  // Parameters in the flat buffer: total_numel() less the quantized ones.
  std::int64_t dense_numel() const { return dense_; }
  void attach_nf4(std::shared_ptr<const Nf4Store> store) { nf4_ = std::move(store); }
  const Nf4Store* nf4() const { return nf4_.get(); }
  // QAT (--qat): which linear modules fake-quantize is the layout's to say, so bind_linear finds it
  // beside LoRA. set_qat checks that the group size divides the input features of every linear
  // weight of the decoder layers (InvalidInput naming --qat-group-size and the first that it
  // does not divide). qat_applies: whether the Linear over `weight` fake-quantizes.
  void set_qat(const QatConfig& qat);
  const QatConfig& qat() const { return qat_; }
  bool qat_applies(const std::string& weight) const;

  // Appends a parameter at the end of the buffer (families' build_layout). A kLinear weight
  // counts into matmul_numel().
  void add(std::string name, Shape shape, ParamKind kind);
  // Matmul parameters that are not a parameter of their own: a tied LM head (the embedding).
  void add_matmul_numel(std::int64_t n) { matmul_numel_ += n; }

  const std::vector<ParamInfo>& params() const { return params_; }
  std::int64_t total_numel() const { return total_; }
  // Parameters that train: the trainable buffer [0, trainable_numel()) of the parameter buffer,
  // and the size of the gradient buffer and of the optimizer states.
  std::int64_t trainable_numel() const { return trainable_; }
  std::int64_t frozen_numel() const { return total_ - trainable_; }
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
  // A view of one parameter's gradient inside a gradient buffer of grad_numel() elements;
  // undefined for a frozen parameter (or an absent name), which has no gradient.
  Tensor grad_view(const Tensor& grads, const std::string& name) const;
  Tensor grad_view(const Tensor& grads, const ParamInfo& p) const;

  // Where gradients live. By default the gradient buffer has the trainable buffer's layout
  // (grad_numel() == trainable_numel(), grad_offset(o) == o). With shared layer gradients
  // (--optimizer-in-backward, train/trainer.h) it is compact: the trainable parameters outside
  // the decoder layers (embeddings, final norm, an untied head) keep their own places, packed
  // first in layout order, and every decoder layer's gradients map onto one shared slot after
  // them, sized for the largest layer. A layer's gradients therefore live only from its backward
  // until its optimizer update, which must consume and zero them before the next layer's
  // backward writes the slot. `layer_ranges` are the layers' trainable runs [begin, end) in the
  // trainable buffer (model/decoder/linear.h param_range; empty runs skipped). Re-laying the
  // buffer out (freeze, add_lora) drops the mapping: call this last.
  void share_layer_gradients(const std::vector<std::pair<std::int64_t, std::int64_t>>& layer_ranges);
  bool shares_layer_gradients() const { return !grad_segments_.empty(); }
  std::int64_t grad_numel() const { return grad_segments_.empty() ? trainable_ : grad_numel_; }
  // A piece of the trainable buffer whose gradients sit contiguously at grad_begin (the
  // affine map from parameter offsets to gradient offsets, piece by piece).
  struct GradSegment {
    std::int64_t begin = 0, end = 0;  // trainable-buffer offsets
    std::int64_t grad_begin = 0;      // offset of `begin`'s gradient in the gradient buffer
    bool shared = false;              // in the layers' shared slot
  };
  // The pieces of [begin, end) (trainable offsets), each with its gradient's place, in order.
  std::vector<GradSegment> grad_segments(std::int64_t begin, std::int64_t end) const;
  // The gradient offset of trainable offset `offset`.
  std::int64_t grad_offset(std::int64_t offset) const;

 private:
  std::vector<ParamInfo> params_;
  std::int64_t total_ = 0;
  std::int64_t trainable_ = 0;
  std::int64_t matmul_numel_ = 0;
  std::int64_t dense_ = 0;  // total_ less the quantized parameters
  LoraConfig lora_;
  std::shared_ptr<const Nf4Store> nf4_;
  QatConfig qat_;
  std::vector<GradSegment> grad_segments_;  // empty: gradients in the trainable buffer's layout
  std::int64_t grad_numel_ = 0;
  // Lays the buffer out again: trainable parameters first, then frozen ones, each in order.
  void relayout();
};

}  // namespace scalelab
