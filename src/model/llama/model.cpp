// The Llama decoder (Llama 3.x, and Qwen2 with q/k/v biases): RMSNorm, grouped-query attention
// with RoPE (llama3 scaling), SwiGLU MLP, tied or untied LM head. Explicit forward and backward
// per layer over the shared decoder pieces (src/model/decoder/) and the kernels of src/kernels;
// parameters and gradients are views into the flat buffers (frozen parameters have no gradient
// view: their weight gradients are skipped).
#include <optional>
#include <vector>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/logprobs.h"
#include "kernels/loss.h"
#include "model/decoder/attention.h"
#include "model/decoder/norm.h"
#include "model/family.h"
#include "model/llama/llama.h"

namespace scalelab {

namespace {

using namespace kernels;

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads, const ModelOptions& o)
      : c_(c), opt_(o), rope_(make_rope_table(c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling)) {
    H_ = c.hidden_size;
    I_ = c.intermediate_size;
    act_.dtype = o.activation_dtype;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const std::string& emb = family_of(c).token_embedding;
    embed_ = layout.view(params, emb);
    dembed_ = layout.grad_view(grads, emb);  // undefined when frozen: no embedding backward
    if (family_of(c).embedding_padding_idx && c.pad_token_id) pad_ = *c.pad_token_id;
    norm_ = bind_norm(NormKind::kRMSNorm, eps, layout, params, grads, "model.norm.weight");
    // Grad-ready ranges (trainable parameters only; empty when all are frozen).
    embed_range_ = param_range(layout, std::vector<std::string>{emb});
    head_range_ = param_range(layout, std::vector<std::string>{"model.norm.weight", "lm_head.weight"});
    if (c.tie_word_embeddings) {
      head_.w = embed_;
      head_.dw = dembed_;
      head_.frozen = !dembed_.defined();
    } else {
      head_ = bind_linear(layout, params, grads, {"lm_head.weight"});
    }
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = llama_layer_prefix(l);
      const std::string a = p + "self_attn.", m = p + "mlp.";
      Layer w;
      w.ln1 = bind_norm(NormKind::kRMSNorm, eps, layout, params, grads, p + "input_layernorm.weight");
      w.attn.qkv = bind_linear(layout, params, grads, {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
      w.attn.out = bind_linear(layout, params, grads, {a + "o_proj.weight"});
      w.attn.n_heads = c.num_attention_heads;
      w.attn.n_kv_heads = c.num_key_value_heads;
      w.attn.head_dim = c.head_dim;
      w.attn.rope = &rope_;
      w.attn.impl = o.attention;
      w.ln2 = bind_norm(NormKind::kRMSNorm, eps, layout, params, grads, p + "post_attention_layernorm.weight");
      w.gate_up = bind_linear(layout, params, grads, {m + "gate_proj.weight", m + "up_proj.weight"});
      w.down = bind_linear(layout, params, grads, {m + "down_proj.weight"});
      w.range = param_range(layout, p);
      layers_.push_back(std::move(w));
    }
    first_backward_ = first_backward_layer(layout, llama_layer_prefix, c.num_hidden_layers);
  }

  double forward_backward(const Batch& b, float grad_scale, ExecContext& ctx) override {
    return train_step(b, grad_scale, nullptr, ctx);
  }

  double forward_backward_logprobs(const Batch& b, const LogprobLoss& loss, ExecContext& ctx) override {
    SCALELAB_CHECK(!opt_.fused_kernels, "[llama] a loss over token log-probabilities (DPO) needs the unfused head — "
                                        "run without --fused-kernels");
    return train_step(b, 0.0f, &loss, ctx);
  }

  void forward_logprobs(Tensor& logp, const Batch& b, ExecContext& ctx) override {
    SCALELAB_CHECK(!opt_.fused_kernels, "[llama] token log-probabilities (DPO) need the unfused head — run without "
                                        "--fused-kernels");
    Tensor logits;
    forward_loss(b, ctx, &logits);
    // forward_loss's lse is gone with its scope: recompute it (one pass over the logits).
    Tensor lse = act_.f32({b.batch * b.seq}, "loss lse");
    cross_entropy_forward(lse, logits, b.targets, ctx);
    token_logprobs_forward(logp, logits, lse, b.targets, ctx);
  }

 private:
  // forward_backward with the mean cross-entropy (logprob_loss null) or a loss over the token
  // log-probabilities.
  double train_step(const Batch& b, float grad_scale, const LogprobLoss* logprob_loss, ExecContext& ctx) {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq, L = c_.num_hidden_layers;
    std::vector<Acts> acts(static_cast<std::size_t>(L));
    // The parts of the step, for the memory plan's categories (core/allocator.h).
    AllocRegion region("activations");
    std::optional<RegionScope> part(std::in_place, ctx, "forward", Phase::kForward);
    Tensor x = embed(b, ctx);
    for (std::int64_t l = 0; l < L; ++l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      Tensor out = act_.act({T, H_}, "residual stream");
      {
        RegionScope layer(ctx, "layer", l, Phase::kForward);
        layer_forward(l, x, out, a, b, ctx);
      }
      if (opt_.activation_checkpointing) a.drop_all_but_input();
      if (l < first_backward_) a = Acts();  // no backward runs here: nothing to keep
      x = out;
    }
    // Head: final norm, LM head, loss, and at once their backward. Unfused: the [T, vocab]
    // logits exist (their gradient is written in place); fused: chunk by chunk, never whole.
    part.reset();
    part.emplace(ctx, "head", Phase::kForward);  // final norm, LM head and loss, then their backward
    region.set("head buffers");
    Tensor xf = act_.act({T, H_}, "final norm output");
    NormStats sf = norm_.new_stats(T, act_, "final norm mean", "final norm rstd");
    norm_.forward(xf, sf, x, ctx);
    LossSum ls;
    Tensor dxf;
    double custom_loss = 0;
    if (logprob_loss != nullptr) {
      Tensor logits = act_.act({T, c_.vocab_size}, "logits");
      head_.forward(logits, xf, ctx);
      Tensor lse = act_.f32({T}, "loss lse");
      cross_entropy_forward(lse, logits, b.targets, ctx);
      Tensor logp = act_.f32({T}, "token log-probabilities");
      token_logprobs_forward(logp, logits, lse, b.targets, ctx);
      Tensor dlogp = act_.f32({T}, "token log-probability gradients");
      custom_loss = (*logprob_loss)(logp, dlogp, ctx);
      token_logprobs_backward(logits, logits, lse, b.targets, dlogp, ctx);
      dxf = act_.act({T, H_}, "final norm gradient");
      head_.backward(&dxf, logits, xf, ctx);
    } else if (opt_.fused_kernels) {
      const std::int64_t n = count_target_tokens(b.targets, ctx);
      SCALELAB_CHECK(n > 0, "[llama] the batch has no target tokens to train on");
      dxf = act_.act({T, H_}, "final norm gradient");
      ls = fused_linear_cross_entropy(dxf, head_.dw, xf, head_.w, b.targets, grad_scale / static_cast<float>(n),
                                      opt_.fused_loss_chunk, ctx);
    } else {
      Tensor logits = act_.act({T, c_.vocab_size}, "logits");
      head_.forward(logits, xf, ctx);
      Tensor lse = act_.f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      SCALELAB_CHECK(ls.count > 0, "[llama] the batch has no target tokens to train on");
      cross_entropy_backward(logits, logits, lse, b.targets, grad_scale / static_cast<float>(ls.count), ctx);
      dxf = act_.act({T, H_}, "final norm gradient");
      head_.backward(&dxf, logits, xf, ctx);
    }
    region.set("backward temporaries");
    Tensor dx = act_.act({T, H_}, "residual gradient");
    norm_.backward(dx, dxf, x, sf, ctx);
    dxf = Tensor();
    xf = Tensor();
    part.reset();
    part.emplace(ctx, "backward", Phase::kBackward);
    if (hook_ && head_range_.second > head_range_.first) hook_(head_range_.first, head_range_.second);
    for (std::int64_t l = L - 1; l >= first_backward_; --l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      RegionScope layer(ctx, "layer", l, Phase::kBackward);
      if (opt_.activation_checkpointing) {
        AllocRegion recompute("recomputed layer");
        Tensor out = act_.act({T, H_}, "recomputed residual");
        layer_forward(l, a.x, out, a, b, ctx);
      }
      layer_backward(l, dx, a, b, ctx);
      a = Acts();
      const auto& r = layers_[static_cast<std::size_t>(l)].range;
      if (hook_ && r.second > r.first) hook_(r.first, r.second);
    }
    if (dembed_.defined()) embedding_backward(dembed_, dx, b.inputs, ctx, pad_);
    if (hook_ && embed_range_.second > embed_range_.first) hook_(embed_range_.first, embed_range_.second);
    return logprob_loss != nullptr ? custom_loss : ls.sum / static_cast<double>(ls.count);
  }

 public:

  double forward_loss(const Batch& b, ExecContext& ctx, Tensor* logits_out) override {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq;
    Tensor x = embed(b, ctx);
    for (std::int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      Acts a;
      Tensor out = act_.act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, ctx);
      x = out;
    }
    Tensor xf = act_.act({T, H_}, "final norm output");
    NormStats sf = norm_.new_stats(T, act_, "final norm mean", "final norm rstd");
    norm_.forward(xf, sf, x, ctx);
    LossSum ls;
    if (opt_.fused_kernels && logits_out == nullptr) {
      ls = fused_linear_cross_entropy_forward(xf, head_.w, b.targets, opt_.fused_loss_chunk, ctx);
    } else {
      Tensor logits = act_.act({T, c_.vocab_size}, "logits");
      head_.forward(logits, xf, ctx);
      Tensor lse = act_.f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      if (logits_out) *logits_out = logits;
    }
    return ls.count ? ls.sum / static_cast<double>(ls.count) : 0.0;
  }

  Tensor forward_cached(const Batch& b, KvCache& cache, ExecContext& ctx) override {
    SCALELAB_CHECK(b.batch == 1, "[llama] cached inference takes one sequence");
    const std::int64_t T = b.seq;
    cache_ = &cache;
    struct Detach {
      KvCache*& c;
      ~Detach() { c = nullptr; }
    } detach{cache_};
    Tensor x = embed(b, ctx);
    for (std::int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      Acts a;
      Tensor out = act_.act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, ctx);
      x = out;
    }
    Tensor xf = act_.act({T, H_}, "final norm output");
    NormStats sf = norm_.new_stats(T, act_, "final norm mean", "final norm rstd");
    norm_.forward(xf, sf, x, ctx);
    Tensor logits = act_.act({T, c_.vocab_size}, "logits");
    head_.forward(logits, xf, ctx);
    cache.length += T;
    return logits;
  }

 private:
  struct Layer {
    Norm ln1, ln2;         // input_layernorm, post_attention_layernorm
    AttentionBlock attn;   // q/k/v (+ biases: Qwen2), RoPE, o_proj
    Linear gate_up, down;  // gate_proj and up_proj as one [2I, H] GEMM; down_proj
    std::pair<std::int64_t, std::int64_t> range;  // the layer's range in the flat buffer
  };
  // What a layer keeps from forward for backward.
  struct Acts {
    Tensor x;           // layer input (residual stream) [T, H]
    NormStats n1;       // input_layernorm rstd [T]
    Tensor y1;          // input_layernorm output [T, H] (fused: rebuilt in backward)
    AttentionActs att;  // qkv (after RoPE), probabilities or lse, attention output
    Tensor h;           // residual after attention [T, H]
    NormStats n2;       // post_attention_layernorm rstd [T]
    Tensor y2;          // post_attention_layernorm output [T, H] (fused: rebuilt in backward)
    Tensor gu;          // gate and up projections [T, 2I]
    Tensor act;         // silu(gate) * up [T, I] (fused: not kept, recomputed in backward)
    void drop_all_but_input() {
      Tensor keep = x;
      *this = Acts();
      x = keep;
    }
  };

  void check_batch(const Batch& b) {
    SCALELAB_CHECK(b.seq <= c_.max_position_embeddings,
                   "[llama] sequence length " + std::to_string(b.seq) + " exceeds max_position_embeddings " +
                       std::to_string(c_.max_position_embeddings));
  }

  Tensor embed(const Batch& b, ExecContext& ctx) {
    act_.alloc = ctx.alloc;
    Tensor x = act_.act({b.batch * b.seq, H_}, "embeddings");
    embedding_forward(x, b.inputs, embed_, ctx);
    return x;
  }

  void layer_forward(std::int64_t l, const Tensor& x, Tensor& out, Acts& a, const Batch& b, ExecContext& ctx) {
    const Layer& w = layers_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq;
    const bool fused = opt_.fused_kernels;
    a.x = x;
    a.n1 = w.ln1.new_stats(T, act_, "rmsnorm mean", "rmsnorm rstd");
    a.y1 = act_.act({T, H_}, "attention norm output");
    w.ln1.forward(a.y1, a.n1, x, ctx);
    // Fused: y1 is dropped once projected and rebuilt from x and the rstd in backward.
    if (cache_) {
      w.attn.forward_cached(a.att, a.h, a.y1, *cache_, l, act_, ctx);
    } else {
      w.attn.forward(a.att, a.h, a.y1, /*release_in=*/fused, b.batch, b.seq, act_, ctx);
    }
    a.n2 = w.ln2.new_stats(T, act_, "rmsnorm mean", "rmsnorm rstd");
    a.y2 = act_.act({T, H_}, "mlp norm output");
    w.ln2.residual_forward(a.h, a.y2, a.n2, x, fused, ctx);  // h = x + o_proj(attn), y2 = rmsnorm(h)
    a.gu = act_.act({T, 2 * I_}, "mlp gate/up");
    w.gate_up.forward(a.gu, a.y2, ctx);
    if (fused) a.y2 = Tensor();  // rebuilt from h and rstd2 in backward
    a.act = act_.act({T, I_}, "mlp activation");
    swiglu_forward(a.act, a.gu, ctx);
    w.down.forward(out, a.act, ctx);
    // Recomputed in backward by the fused SwiGLU/down_proj kernel, or (QAT) by swiglu_forward
    // before an unfused MLP backward; kept when down_proj carries a LoRA adapter, whose gradients
    // need it, or an NF4 base the kernel cannot read (that layer's MLP backward then runs unfused).
    if (fused && (fused_mlp_backward(w.down) || recompute_mlp_activation(w.down))) a.act = Tensor();
    add_(out, a.h, ctx);
  }

  // Whether --fused-kernels' SwiGLU/down_proj backward kernel can serve this layer: a dense
  // down_proj without an adapter and without QAT's fake quantization.
  static bool fused_mlp_backward(const Linear& down) { return !down.adapter && !down.quantized && !down.quant; }
  // QAT's down_proj (no adapter): the fused kernel cannot take it — the straight-through gradient
  // of dact = ste(dout·fq(W); act) needs the activation's per-token scale before the kernel would
  // rebuild the activation, and dW needs fq(act) — so the activation is not kept either: backward
  // rebuilds it with swiglu_forward (bit for bit what forward computed) and runs the MLP unfused.
  // The fused rung's memory saving (no [T, I] activation kept per layer) stays.
  static bool recompute_mlp_activation(const Linear& down) { return down.quant && !down.adapter && !down.quantized; }

  // dx holds the gradient of the layer's output on entry and of its input on return.
  void layer_backward(std::int64_t l, Tensor& dx, Acts& a, const Batch& b, ExecContext& ctx) {
    Layer& w = layers_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq;
    const bool fused = opt_.fused_kernels;
    // MLP: out = h + down(swiglu(gate_up(rmsnorm(h)))).
    Tensor dgu;
    if (fused && fused_mlp_backward(w.down)) {
      // dact, the recomputed activation and dW_down in one kernel (no dW_down when frozen: the
      // gradient is undefined); dgu is written over gu.
      swiglu_down_backward_recompute(a.gu, w.down.dw, dx, a.gu, w.down.w, ctx);
      dgu = a.gu;
    } else {
      // Unfused; also under --fused-kernels when down_proj has a LoRA adapter (the kernel has no
      // adapter term: the adapter's input gradient and its A/B gradients need the activation), an
      // NF4 base (QLoRA: the kernel reads a dense weight) or QAT (the kernel multiplies by the
      // weight as it is and has no straight-through mask).
      if (fused && recompute_mlp_activation(w.down)) {
        a.act = act_.act({T, I_}, "mlp activation (recomputed)");
        swiglu_forward(a.act, a.gu, ctx);
      }
      Tensor dact = act_.act({T, I_}, "mlp activation gradient");
      w.down.backward(&dact, dx, a.act, ctx);
      a.act = Tensor();
      dgu = act_.act({T, 2 * I_}, "mlp gate/up gradient");
      swiglu_backward(dgu, dact, a.gu, ctx);
    }
    if (fused) {
      a.y2 = act_.act({T, H_}, "mlp norm output (recomputed)");
      w.ln2.recompute(a.y2, a.h, a.n2, ctx);
    }
    Tensor dy = act_.act({T, H_}, "norm output gradient");
    w.gate_up.backward(&dy, dgu, a.y2, ctx);
    dgu = Tensor();
    a.gu = Tensor();
    a.y2 = Tensor();
    w.ln2.residual_backward(dx, dy, a.h, a.n2, fused, ctx);  // dx is now dh
    // Attention: h = x + o_proj(attention(rope(qkv(rmsnorm(x))))).
    Tensor dh = dx;
    Tensor dqkv = w.attn.backward_to_qkv(dh, a.att, b.batch, b.seq, act_, ctx);
    if (fused) {
      a.y1 = act_.act({T, H_}, "attention norm output (recomputed)");
      w.ln1.recompute(a.y1, a.x, a.n1, ctx);
    }
    // The input gradient of the lowest layer that runs backward reaches only frozen layers and
    // the embedding: with the embedding frozen (LoRA, QLoRA, --freeze) nothing reads it, and
    // autograd computes none for an input that needs no gradient (peft's run). Its q/k/v input
    // gradient (the dx GEMM, an adapter's dz·A, QLoRA's dequantized tiles) and the norm's are
    // skipped, unless the norm's own weight trains.
    const bool input_grad = l > first_backward_ || dembed_.defined() || w.ln1.dw.defined();
    w.attn.qkv.backward(input_grad ? &dy : nullptr, dqkv, a.y1, ctx);  // the q/k/v biases' gradients too (Qwen2)
    a.y1 = Tensor();
    dqkv = Tensor();
    if (input_grad) w.ln1.residual_backward(dx, dy, a.x, a.n1, fused, ctx);
  }

  ModelConfig c_;
  ModelOptions opt_;
  RopeTable rope_;
  ActAlloc act_;
  std::int64_t H_ = 0, I_ = 0;
  std::int64_t pad_ = -1;  // the padding_idx row that lookups do not train (Qwen2's pad_token_id)
  Tensor embed_, dembed_;
  Norm norm_;
  Linear head_;
  std::pair<std::int64_t, std::int64_t> embed_range_, head_range_;
  std::vector<Layer> layers_;
  std::int64_t first_backward_ = 0;  // layers below it have no backward (decoder/linear.h first_backward_layer)
  KvCache* cache_ = nullptr;  // set during forward_cached: attention reads and extends it
};

}  // namespace

std::unique_ptr<Model> make_llama_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                        const ModelOptions& o) {
  return std::make_unique<LlamaModel>(c, layout, params, grads, o);
}

}  // namespace scalelab
