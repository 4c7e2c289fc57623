// The OPT decoder (transformers' OPTForCausalLM): learned positional embeddings with an offset of
// 2, optional project_in / project_out (word_embed_proj_dim != hidden_size, as opt-350m),
// pre-LN (do_layer_norm_before) or post-LN decoder layers with LayerNorm (optionally without
// elementwise affine), biases (enable_bias), ReLU or GELU MLP, multi-head attention with q scaled
// by head_dim^-0.5, residual dropout after out_proj and fc2, the final decoder LayerNorm when
// do_layer_norm_before, and the LM head tied to embed_tokens (or untied).
//
// Explicit forward and backward per layer over the shared decoder pieces (src/model/decoder/),
// as src/model/llama/model.cpp; activations are stored in ModelOptions::activation_dtype,
// LayerNorm statistics and the loss' log-sum-exp in fp32. The memory plan runs this same code on the
// meta device (src/train/memory_plan.cpp), so every allocation below is planned as it is.
//
// DPO (forward_logprobs / forward_backward_logprobs): the loss over each target's log-probability
// instead of the mean cross-entropy, with the unfused head (train/dpo.h).
//
// Dropout masks are never stored: a counter-based generator keyed by (seed, micro-step, layer,
// site) regenerates them in backward and in a checkpointed layer's recomputation
// (kernels/dropout.h). Backward needs one [T, H] buffer for the masked gradient at each site.
//
// --fused-kernels changes how, not what: the residual add is fused into the LayerNorm that
// follows it (layernorm_residual_forward); fc1's bias and the ReLU are one in-place pass whose
// output is the only MLP tensor kept (no pre-activation); the LayerNorm outputs that feed only a
// GEMM (pre-LN: both; post-LN: the MLP input once the second residual is formed) are dropped
// after forward and rebuilt in backward from the saved statistics (layernorm_recompute); and the
// LM head + cross-entropy run chunk by chunk (fused_linear_cross_entropy), so the [tokens, vocab]
// logits never exist.
#include <optional>
#include <vector>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/logprobs.h"
#include "kernels/loss.h"
#include "model/decoder/attention.h"
#include "model/decoder/norm.h"
#include "model/opt/opt.h"

namespace scalelab {

namespace {

using namespace kernels;

// OPT's learned positions start at row 2 of embed_positions (transformers' offset).
constexpr std::int64_t kPositionOffset = 2;
// Dropout sites within a layer (kernels::DropoutKey::site).
constexpr std::int64_t kSiteAttention = 0, kSiteMlp = 1;

class OptModel final : public Model {
 public:
  OptModel(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads, const ModelOptions& o)
      : c_(c), opt_(o), act_fn_(parse_activation(c.activation_function)) {
    SCALELAB_CHECK(c.family == ModelFamily::kOPT, "[opt] the OPT model was given a non-OPT config");
    H_ = c.hidden_size;
    I_ = c.intermediate_size;
    P_ = c.word_embed_proj_dim;
    pre_ln_ = c.do_layer_norm_before;
    final_ln_ = c.has_final_layer_norm();
    act_.dtype = o.activation_dtype;
    const float eps = static_cast<float>(c.layer_norm_eps);
    const std::string d = "model.decoder.";
    embed_ = layout.view(params, d + "embed_tokens.weight");
    dembed_ = layout.grad_view(grads, d + "embed_tokens.weight");  // undefined when frozen
    pos_ = layout.view(params, d + "embed_positions.weight");
    dpos_ = layout.grad_view(grads, d + "embed_positions.weight");
    if (layout.find(d + "project_in.weight")) proj_in_ = bind_linear(layout, params, grads, {d + "project_in.weight"});
    if (layout.find(d + "project_out.weight")) {
      proj_out_ = bind_linear(layout, params, grads, {d + "project_out.weight"});
    }
    final_norm_ = bind_norm(NormKind::kLayerNorm, eps, layout, params, grads, d + "final_layer_norm.weight",
                            d + "final_layer_norm.bias");
    if (c.tie_word_embeddings) {
      head_.w = embed_;
      head_.dw = dembed_;
      head_.frozen = !dembed_.defined();
    } else {
      head_ = bind_linear(layout, params, grads, {"lm_head.weight"});
    }
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = opt_layer_prefix(l), a = p + "self_attn.";
      Layer w;
      w.ln1 = bind_norm(NormKind::kLayerNorm, eps, layout, params, grads, p + "self_attn_layer_norm.weight",
                        p + "self_attn_layer_norm.bias");
      w.attn.qkv = bind_linear(layout, params, grads, {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
      w.attn.out = bind_linear(layout, params, grads, {a + "out_proj.weight"}, {a + "out_proj.bias"});
      w.attn.n_heads = w.attn.n_kv_heads = c.num_attention_heads;
      w.attn.head_dim = c.head_dim;
      w.attn.impl = o.attention;  // no RoPE: positions are learned embeddings
      w.ln2 = bind_norm(NormKind::kLayerNorm, eps, layout, params, grads, p + "final_layer_norm.weight",
                        p + "final_layer_norm.bias");
      w.fc1 = bind_linear(layout, params, grads, {p + "fc1.weight"}, {p + "fc1.bias"});
      w.fc2 = bind_linear(layout, params, grads, {p + "fc2.weight"}, {p + "fc2.bias"});
      w.range = param_range(layout, p);
      layers_.push_back(std::move(w));
    }
    // Flat-buffer ranges for the grad-ready hook: the embeddings (and project_in) come before the
    // layers, the final norm, project_out and an untied head after them.
    // (Trainable parameters only, in the gradient buffer; empty when all are frozen.)
    embed_range_ = param_range(layout, std::vector<std::string>{d + "embed_tokens.weight", d + "embed_positions.weight",
                                                                d + "project_in.weight"});
    head_range_ = param_range(layout, std::vector<std::string>{d + "final_layer_norm.weight", d + "final_layer_norm.bias",
                                                               d + "project_out.weight", "lm_head.weight"});
    first_backward_ = first_backward_layer(layout, opt_layer_prefix, c.num_hidden_layers);
  }

  double forward_backward(const Batch& b, float grad_scale, ExecContext& ctx) override {
    return train_step(b, grad_scale, nullptr, ctx);
  }

  // DPO (train/dpo.h): the loss over each target's log-probability. The [chosen; rejected] rows
  // are right-padded, so each row's learned positions are 0, 1, ... as transformers' OPT gives a
  // row without padding (its positions come from the attention mask's cumulative sum), and the
  // padding after a row's last token changes nothing before it (causal attention).
  double forward_backward_logprobs(const Batch& b, const LogprobLoss& loss, ExecContext& ctx) override {
    SCALELAB_CHECK(!opt_.fused_kernels, "[opt] a loss over token log-probabilities (DPO) needs the unfused head — "
                                        "run without --fused-kernels");
    return train_step(b, 0.0f, &loss, ctx);
  }

  // Forward only (no dropout, as forward_loss): each target's log-probability into logp.
  void forward_logprobs(Tensor& logp, const Batch& b, ExecContext& ctx) override {
    SCALELAB_CHECK(!opt_.fused_kernels, "[opt] token log-probabilities (DPO) need the unfused head — run without "
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
  // log-probabilities (DPO).
  double train_step(const Batch& b, float grad_scale, const LogprobLoss* logprob_loss, ExecContext& ctx) {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq, L = c_.num_hidden_layers;
    std::vector<Acts> acts(static_cast<std::size_t>(L));
    // The parts of the step, for the memory plan's categories (core/allocator.h).
    AllocRegion region("activations");
    Tensor emb_in;  // token embeddings before project_in (kept for its weight gradient)
    std::optional<RegionScope> part(std::in_place, ctx, "forward", Phase::kForward);
    Tensor x = embed(b, emb_in, ctx);
    for (std::int64_t l = 0; l < L; ++l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      Tensor out = act_.act({T, H_}, "residual stream");
      {
        RegionScope layer(ctx, "layer", l, Phase::kForward);
        layer_forward(l, x, out, a, b, /*training=*/true, ctx);
      }
      if (opt_.activation_checkpointing) a.drop_all_but_input();
      if (l < first_backward_) a = Acts();  // no backward runs here: nothing to keep
      x = out;
    }
    // Head: final LayerNorm, project_out, LM head and loss; then their backward.
    part.reset();
    part.emplace(ctx, "head", Phase::kForward);  // final norm, LM head and loss, then their backward
    region.set("head buffers");
    HeadActs h = head_forward(x, ctx);
    Tensor dxp = act_.act({T, P_}, "head input gradient");
    LossSum ls;
    double custom_loss = 0;
    if (logprob_loss != nullptr) {
      Tensor logits = act_.act({T, c_.vocab_size}, "logits");
      head_.forward(logits, h.xp, ctx);
      Tensor lse = act_.f32({T}, "loss lse");
      cross_entropy_forward(lse, logits, b.targets, ctx);
      Tensor logp = act_.f32({T}, "token log-probabilities");
      token_logprobs_forward(logp, logits, lse, b.targets, ctx);
      Tensor dlogp = act_.f32({T}, "token log-probability gradients");
      custom_loss = (*logprob_loss)(logp, dlogp, ctx);
      token_logprobs_backward(logits, logits, lse, b.targets, dlogp, ctx);
      head_.backward(&dxp, logits, h.xp, ctx);
    } else if (opt_.fused_kernels) {
      const std::int64_t count = count_target_tokens(b.targets, ctx);
      SCALELAB_CHECK(count > 0, "[opt] the batch has no target tokens to train on");
      ls = fused_linear_cross_entropy(dxp, head_.dw, h.xp, head_.w, b.targets, grad_scale / static_cast<float>(count),
                                      opt_.fused_loss_chunk, ctx);
    } else {
      Tensor logits = act_.act({T, c_.vocab_size}, "logits");
      head_.forward(logits, h.xp, ctx);
      Tensor lse = act_.f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      SCALELAB_CHECK(ls.count > 0, "[opt] the batch has no target tokens to train on");
      cross_entropy_backward(logits, logits, lse, b.targets, grad_scale / static_cast<float>(ls.count), ctx);
      head_.backward(&dxp, logits, h.xp, ctx);
    }
    Tensor dx = head_backward(h, x, dxp, ctx);
    region.set("backward temporaries");
    dxp = Tensor();
    h = HeadActs();
    x = Tensor();
    part.reset();
    part.emplace(ctx, "backward", Phase::kBackward);
    if (hook_ && head_range_.second > head_range_.first) hook_(head_range_.first, head_range_.second);
    for (std::int64_t l = L - 1; l >= first_backward_; --l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      RegionScope layer(ctx, "layer", l, Phase::kBackward);
      if (opt_.activation_checkpointing) {
        AllocRegion recompute("recomputed layer");
        Tensor out = act_.act({T, H_}, "recomputed residual");
        layer_forward(l, a.x, out, a, b, /*training=*/true, ctx);
      }
      layer_backward(l, dx, a, b, ctx);
      a = Acts();
      const auto& r = layers_[static_cast<std::size_t>(l)].range;
      if (hook_ && r.second > r.first) hook_(r.first, r.second);
    }
    embed_backward(b, emb_in, dx, ctx);
    if (hook_ && embed_range_.second > embed_range_.first) hook_(embed_range_.first, embed_range_.second);
    return logprob_loss != nullptr ? custom_loss : ls.sum / static_cast<double>(ls.count);
  }

 public:
  double forward_loss(const Batch& b, ExecContext& ctx, Tensor* logits_out) override {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq;
    Tensor emb_in;
    Tensor x = embed(b, emb_in, ctx);
    emb_in = Tensor();
    for (std::int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      Acts a;
      Tensor out = act_.act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, /*training=*/false, ctx);
      x = out;
    }
    HeadActs h = head_forward(x, ctx);
    LossSum ls;
    if (opt_.fused_kernels && logits_out == nullptr) {
      ls = fused_linear_cross_entropy_forward(h.xp, head_.w, b.targets, opt_.fused_loss_chunk, ctx);
    } else {
      Tensor logits = act_.act({T, c_.vocab_size}, "logits");
      head_.forward(logits, h.xp, ctx);
      Tensor lse = act_.f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      if (logits_out) *logits_out = logits;
    }
    return ls.count ? ls.sum / static_cast<double>(ls.count) : 0.0;
  }

  Tensor forward_cached(const Batch& b, KvCache& cache, ExecContext& ctx) override {
    SCALELAB_CHECK(b.batch == 1, "[opt] cached inference takes one sequence");
    const std::int64_t T = b.seq;
    if (cache.length + T > c_.max_position_embeddings) {
      throw InvalidInput("[generate] position " + std::to_string(cache.length + T - 1) +
                         " is past max_position_embeddings " + std::to_string(c_.max_position_embeddings) +
                         " — use a shorter prompt or fewer --max-new-tokens");
    }
    cache_ = &cache;
    struct Detach {
      KvCache*& c;
      ~Detach() { c = nullptr; }
    } detach{cache_};
    Tensor emb_in;
    Tensor x = embed(b, emb_in, ctx);
    emb_in = Tensor();
    for (std::int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      Acts a;
      Tensor out = act_.act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, /*training=*/false, ctx);
      x = out;
    }
    HeadActs h = head_forward(x, ctx);
    Tensor logits = act_.act({T, c_.vocab_size}, "logits");
    head_.forward(logits, h.xp, ctx);
    cache.length += T;
    return logits;
  }

 private:
  struct Layer {
    Norm ln1;             // self_attn_layer_norm (no affine: undefined weight and bias)
    AttentionBlock attn;  // q/k/v (+ biases) as one [3H, H] GEMM, out_proj (+ bias)
    Norm ln2;             // final_layer_norm (the layer's second LayerNorm)
    Linear fc1, fc2;
    std::pair<std::int64_t, std::int64_t> range;  // the layer's range in the flat buffer
  };
  // What a layer keeps from forward for backward. Pre-LN: ln1 normalizes x into a_in, ln2
  // normalizes h into m_in. Post-LN: ln1 normalizes h into m_in, ln2 normalizes h2 into the
  // layer output.
  struct Acts {
    Tensor x;           // layer input [T, H]
    NormStats n1;       // ln1 mean and rstd [T] (fp32)
    Tensor a_in;        // pre-LN: ln1 output, the attention input [T, H]
    AttentionActs att;  // qkv [T, 3H], probabilities or lse, attention output [T, H]
    Tensor h;           // x + dropout(out_proj(attn)) [T, H]
    NormStats n2;       // ln2 statistics [T]
    Tensor m_in;        // MLP input (a LayerNorm output) [T, H]
    Tensor pre;         // fc1 output before the activation [T, I] (unfused only)
    Tensor act;         // activation output [T, I]
    Tensor h2;          // post-LN: MLP residual sum, ln2's input [T, H]
    void drop_all_but_input() {
      Tensor keep = x;
      *this = Acts();
      x = keep;
    }
  };
  struct HeadActs {
    NormStats nf;  // final LayerNorm statistics
    Tensor xf;     // final LayerNorm output (or the last layer's output when there is none)
    Tensor xp;     // project_out output (or xf), the LM head's input [T, P]
  };

  void check_batch(const Batch& b) const {
    SCALELAB_CHECK(b.seq <= c_.max_position_embeddings,
                   "[opt] sequence length " + std::to_string(b.seq) + " exceeds max_position_embeddings " +
                       std::to_string(c_.max_position_embeddings));
  }

  DropoutKey key(std::int64_t layer, std::int64_t site) const { return {opt_.seed, step_, layer, site}; }
  float dropout_p() const { return static_cast<float>(opt_.dropout); }

  // x = project_in(embed_tokens[ids]) + embed_positions[pos + 2].
  Tensor embed(const Batch& b, Tensor& emb_in, ExecContext& ctx) {
    act_.alloc = ctx.alloc;
    const std::int64_t T = b.batch * b.seq;
    Tensor x;
    if (proj_in_.w.defined()) {
      emb_in = act_.act({T, P_}, "embeddings");
      embedding_forward(emb_in, b.inputs, embed_, ctx);
      x = act_.act({T, H_}, "embeddings (projected)");
      proj_in_.forward(x, emb_in, ctx);
    } else {
      x = act_.act({T, H_}, "embeddings");
      embedding_forward(x, b.inputs, embed_, ctx);
    }
    // With a KV cache the rows continue the cached positions.
    position_embedding_add_forward(x, pos_, b.seq, kPositionOffset + (cache_ ? cache_->length : 0), ctx);
    return x;
  }

  void embed_backward(const Batch& b, Tensor& emb_in, Tensor& dx, ExecContext& ctx) {
    const std::int64_t skip = c_.pad_token_id ? *c_.pad_token_id : -1;
    // Frozen tables (undefined gradients) get no backward; a frozen project_in no weight gradient.
    if (dpos_.defined()) position_embedding_backward(dpos_, dx, b.seq, kPositionOffset, ctx);
    if (proj_in_.w.defined()) {
      Tensor de;
      if (dembed_.defined()) de = act_.act({b.batch * b.seq, P_}, "embedding gradient");
      proj_in_.backward(dembed_.defined() ? &de : nullptr, dx, emb_in, ctx);
      dx = Tensor();
      emb_in = Tensor();
      if (dembed_.defined()) embedding_backward(dembed_, de, b.inputs, ctx, skip);
    } else if (dembed_.defined()) {
      embedding_backward(dembed_, dx, b.inputs, ctx, skip);
    }
  }

  HeadActs head_forward(const Tensor& x, ExecContext& ctx) {
    const std::int64_t T = x.numel() / H_;
    HeadActs h;
    if (final_ln_) {
      h.nf = final_norm_.new_stats(T, act_, "final norm mean", "final norm rstd");
      h.xf = act_.act({T, H_}, "final norm output");
      final_norm_.forward(h.xf, h.nf, x, ctx);
    } else {
      h.xf = x;
    }
    if (proj_out_.w.defined()) {
      h.xp = act_.act({T, P_}, "project_out output");
      proj_out_.forward(h.xp, h.xf, ctx);
    } else {
      h.xp = h.xf;
    }
    return h;
  }

  // From the gradient of the LM head's input to the gradient of the last layer's output x. Frees
  // project_out's buffers as it goes; the caller frees the rest of the head.
  Tensor head_backward(HeadActs& h, const Tensor& x, Tensor& dxp, ExecContext& ctx) {
    const std::int64_t T = x.numel() / H_;
    Tensor dxf = dxp;
    if (proj_out_.w.defined()) {
      dxf = act_.act({T, H_}, "final norm gradient");
      proj_out_.backward(&dxf, dxp, h.xf, ctx);
      dxp = Tensor();
      h.xp = Tensor();
    }
    if (!final_ln_) return dxf;
    Tensor dx;
    {
      AllocRegion backward("backward temporaries");
      dx = act_.act({T, H_}, "residual gradient");
    }
    final_norm_.backward(dx, dxf, x, h.nf, ctx);
    return dx;
  }

  // y = ln(x) (plain) and its statistics.
  void norm(Tensor& y, NormStats& s, const Tensor& x, const Norm& n, ExecContext& ctx) {
    const std::int64_t T = x.numel() / H_;
    s = n.new_stats(T, act_, "layernorm mean", "layernorm rstd");
    y = act_.act({T, H_}, "layernorm output");
    n.forward(y, s, x, ctx);
  }
  // h = base + delta (delta already in h) then y = ln(h): fused into one pass, or add + norm.
  void residual_norm(Tensor& h, Tensor& y, NormStats& s, const Tensor& base, const Norm& n, ExecContext& ctx) {
    const std::int64_t T = h.numel() / H_;
    s = n.new_stats(T, act_, "layernorm mean", "layernorm rstd");
    if (!y.defined()) y = act_.act({T, H_}, "layernorm output");
    n.residual_forward(h, y, s, base, opt_.fused_kernels, ctx);
  }

  // MLP up to the activation: a.act (and a.pre unfused) from a.m_in.
  void mlp_up(Acts& a, const Layer& w, std::int64_t T, ExecContext& ctx) {
    if (opt_.fused_kernels) {
      a.act = act_.act({T, I_}, "mlp activation");
      w.fc1.forward(a.act, a.m_in, ctx, /*with_bias=*/false);
      bias_relu_forward(a.act, a.act, w.fc1.b, ctx);  // fc1's bias and the ReLU in one pass
    } else {
      a.pre = act_.act({T, I_}, "mlp fc1 output");
      w.fc1.forward(a.pre, a.m_in, ctx);
      a.act = act_.act({T, I_}, "mlp activation");
      activation_forward(a.act, a.pre, act_fn_, ctx);
    }
  }

  void attention_forward(Acts& a, const Tensor& in, const Layer& w, const Batch& b, bool training, std::int64_t l,
                         ExecContext& ctx) {
    Tensor input = in;
    if (cache_) {
      w.attn.forward_cached(a.att, a.h, input, *cache_, l, act_, ctx);
    } else {
      w.attn.forward(a.att, a.h, input, /*release_in=*/false, b.batch, b.seq, act_, ctx);
    }
    if (training && opt_.dropout > 0) dropout_forward(a.h, dropout_p(), key(l, kSiteAttention), ctx);
  }

  void layer_forward(std::int64_t l, const Tensor& x, Tensor& out, Acts& a, const Batch& b, bool training,
                     ExecContext& ctx) {
    const Layer& w = layers_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq;
    const bool drop = training && opt_.dropout > 0;
    a.x = x;
    if (pre_ln_) {
      norm(a.a_in, a.n1, x, w.ln1, ctx);
      attention_forward(a, a.a_in, w, b, training, l, ctx);
      if (opt_.fused_kernels) a.a_in = Tensor();  // rebuilt in backward
      residual_norm(a.h, a.m_in, a.n2, x, w.ln2, ctx);
      mlp_up(a, w, T, ctx);
      if (opt_.fused_kernels) a.m_in = Tensor();
      w.fc2.forward(out, a.act, ctx);
      if (drop) dropout_forward(out, dropout_p(), key(l, kSiteMlp), ctx);
      add_(out, a.h, ctx);
    } else {
      attention_forward(a, x, w, b, training, l, ctx);
      residual_norm(a.h, a.m_in, a.n1, x, w.ln1, ctx);
      mlp_up(a, w, T, ctx);
      a.h2 = act_.act({T, H_}, "residual stream");
      w.fc2.forward(a.h2, a.act, ctx);
      if (drop) dropout_forward(a.h2, dropout_p(), key(l, kSiteMlp), ctx);
      Tensor y = out;
      residual_norm(a.h2, y, a.n2, a.m_in, w.ln2, ctx);
      if (opt_.fused_kernels) a.m_in = Tensor();
    }
  }

  // The masked gradient of a dropout site: a new buffer when dropout is on, else g itself.
  Tensor dropout_grad(const Tensor& g, std::int64_t l, std::int64_t site, ExecContext& ctx) {
    if (!(opt_.dropout > 0)) return g;
    Tensor d = act_.act(g.shape(), "dropout gradient");
    dropout_backward(d, g, dropout_p(), key(l, site), ctx);
    return d;
  }

  // From dout (gradient of the MLP's output delta, before dropout) to the gradient `dm` of the
  // MLP input (assigned, or added when accumulate); frees the MLP's acts. m_norm / m_src / m_stats
  // rebuild the MLP input when fused kernels dropped it.
  void mlp_backward(std::int64_t l, const Tensor& dout, Tensor& dm, bool accumulate, Acts& a, Layer& w,
                    const Tensor& m_src, const NormStats& m_stats, const Norm& m_norm, ExecContext& ctx) {
    const std::int64_t T = dout.numel() / H_;
    Tensor dd = dropout_grad(dout, l, kSiteMlp, ctx);
    Tensor dact = act_.act({T, I_}, "mlp activation gradient");
    w.fc2.backward(&dact, dd, a.act, ctx);
    dd = Tensor();
    if (opt_.fused_kernels) {
      bias_relu_backward(dact, w.fc1.db.defined() ? &w.fc1.db : nullptr, dact, a.act, ctx);
      a.act = Tensor();
      Tensor m = act_.act({T, H_}, "recomputed norm output");
      m_norm.recompute(m, m_src, m_stats, ctx);
      w.fc1.backward(&dm, dact, m, ctx, accumulate, /*with_bias=*/false);
    } else {
      activation_backward(dact, dact, a.pre, act_fn_, ctx);
      a.act = Tensor();
      a.pre = Tensor();
      w.fc1.backward(&dm, dact, a.m_in, ctx, accumulate);
    }
  }

  // dx holds the gradient of the layer's output on entry and of its input on return.
  void layer_backward(std::int64_t l, Tensor& dx, Acts& a, const Batch& b, ExecContext& ctx) {
    Layer& w = layers_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq;
    if (pre_ln_) {
      // out = h + drop(fc2(act(fc1(ln2(h))))),  h = x + drop(out_proj(attn(qkv(ln1(x))))).
      Tensor dy = act_.act({T, H_}, "norm output gradient");
      mlp_backward(l, dx, dy, false, a, w, a.h, a.n2, w.ln2, ctx);
      w.ln2.backward(dx, dy, a.h, a.n2, ctx, /*accumulate_dx=*/true);
      Tensor dqkv = attention_backward(l, dx, a, w, b, ctx);
      // The lowest backward layer's input gradient reaches only frozen layers and the embeddings
      // (and project_in): with all of them frozen (LoRA, QLoRA, --freeze) nothing reads it, and
      // autograd computes none (peft's run), so the q/k/v input gradient and ln1's are skipped
      // unless ln1's own affine trains (decoder/linear.h first_backward_layer).
      const bool input_grad = l > first_backward_ || embeddings_train() || w.ln1.dw.defined() || w.ln1.db.defined();
      Tensor* dq = input_grad ? &dy : nullptr;
      if (opt_.fused_kernels) {
        Tensor m = act_.act({T, H_}, "recomputed norm output");
        w.ln1.recompute(m, a.x, a.n1, ctx);
        w.attn.qkv.backward(dq, dqkv, m, ctx);
      } else {
        w.attn.qkv.backward(dq, dqkv, a.a_in, ctx);
      }
      dqkv = Tensor();
      if (input_grad) w.ln1.backward(dx, dy, a.x, a.n1, ctx, /*accumulate_dx=*/true);
    } else {
      // out = ln2(h2), h2 = m + drop(fc2(act(fc1(m)))), m = ln1(h), h = x + drop(out_proj(attn(qkv(x)))).
      Tensor dh2 = act_.act({T, H_}, "residual gradient");
      w.ln2.backward(dh2, dx, a.h2, a.n2, ctx);
      dx = dh2;  // the gradient of h2, and of m through the residual
      dh2 = Tensor();
      mlp_backward(l, dx, dx, true, a, w, a.h, a.n1, w.ln1, ctx);
      Tensor dh = act_.act({T, H_}, "residual gradient");
      w.ln1.backward(dh, dx, a.h, a.n1, ctx);
      dx = dh;  // the gradient of h, and of x through the residual
      dh = Tensor();
      Tensor dqkv = attention_backward(l, dx, a, w, b, ctx);
      // As above: the lowest backward layer's q/k/v input gradient only feeds frozen parts.
      w.attn.qkv.backward(l > first_backward_ || embeddings_train() ? &dx : nullptr, dqkv, a.x, ctx,
                          /*accumulate_dx=*/true);
    }
  }

  // Whether anything below the first layer trains: the token or position embeddings, or
  // project_in's weight (its gradient needs the first layer's input gradient).
  bool embeddings_train() const { return dembed_.defined() || dpos_.defined() || proj_in_.dw.defined(); }

  // From dh (gradient of the attention residual sum) to dqkv; frees the attention's acts.
  Tensor attention_backward(std::int64_t l, const Tensor& dh, Acts& a, Layer& w, const Batch& b, ExecContext& ctx) {
    Tensor dd = dropout_grad(dh, l, kSiteAttention, ctx);
    return w.attn.backward_to_qkv(dd, a.att, b.batch, b.seq, act_, ctx);
  }

  ModelConfig c_;
  ModelOptions opt_;
  Activation act_fn_;
  ActAlloc act_;
  std::int64_t H_ = 0, I_ = 0, P_ = 0;
  bool pre_ln_ = true, final_ln_ = true;
  Tensor embed_, dembed_, pos_, dpos_;
  Linear proj_in_, proj_out_, head_;  // project_in / project_out: undefined weights when absent
  Norm final_norm_;
  std::pair<std::int64_t, std::int64_t> embed_range_, head_range_;
  std::vector<Layer> layers_;
  std::int64_t first_backward_ = 0;  // layers below it have no backward (decoder/linear.h first_backward_layer)
  KvCache* cache_ = nullptr;  // set during forward_cached: attention and positions continue it
};

}  // namespace

std::unique_ptr<Model> make_opt_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                      const ModelOptions& o) {
  return std::make_unique<OptModel>(c, layout, params, grads, o);
}

}  // namespace scalelab
