// The OPT family (transformers' OPTForCausalLM): learned positional embeddings with an offset of
// 2, optional project_in / project_out (word_embed_proj_dim != hidden_size, as opt-350m),
// pre-LN (do_layer_norm_before) or post-LN decoder layers with LayerNorm (optionally without
// elementwise affine), biases (enable_bias), ReLU or GELU MLP, multi-head attention with q scaled
// by head_dim^-0.5, residual dropout after out_proj and fc2, the final decoder LayerNorm when
// do_layer_norm_before, and the LM head tied to embed_tokens (or untied).
//
// Explicit forward and backward per layer over the kernels of src/kernels, as src/model/llama.cpp;
// activations are stored in ModelOptions::activation_dtype, LayerNorm statistics and the loss'
// log-sum-exp in fp32. Every allocation below is mirrored, in order, by opt_step() in
// src/train/memory_plan.cpp: change one, change the other.
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
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "model/model.h"

namespace scalelab {

namespace {

using namespace kernels;

// OPT's learned positions start at row 2 of embed_positions (transformers' offset).
constexpr std::int64_t kPositionOffset = 2;
// Dropout sites within a layer (kernels::DropoutKey::site).
constexpr std::int64_t kSiteAttention = 0, kSiteMlp = 1;

Tensor optional_view(const ParamLayout& layout, const Tensor& flat, const std::string& name) {
  const ParamInfo* p = layout.find(name);
  return p ? layout.view(flat, *p) : Tensor();
}

class OptModel final : public Model {
 public:
  OptModel(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads, const ModelOptions& o)
      : c_(c), opt_(o), act_fn_(parse_activation(c.activation_function)) {
    SCALELAB_CHECK(c.family == ModelFamily::kOPT, "[opt] the OPT model was given a non-OPT config");
    if (o.fused_kernels && act_fn_ != Activation::kReLU) {
      throw InvalidInput("[--fused-kernels] the fused OPT MLP is bias+ReLU; activation_function '" +
                         c.activation_function + "' has no fused form — run without --fused-kernels");
    }
    if (!(o.dropout >= 0.0 && o.dropout < 1.0)) {
      throw InvalidInput("[--dropout] must be in [0, 1), got " + std::to_string(o.dropout));
    }
    H_ = c.hidden_size;
    I_ = c.intermediate_size;
    P_ = c.word_embed_proj_dim;
    pre_ln_ = c.do_layer_norm_before;
    final_ln_ = c.has_final_layer_norm();
    eps_ = static_cast<float>(c.layer_norm_eps);
    embed_ = layout.view(params, "model.decoder.embed_tokens.weight");
    dembed_ = layout.view(grads, "model.decoder.embed_tokens.weight");
    pos_ = layout.view(params, "model.decoder.embed_positions.weight");
    dpos_ = layout.view(grads, "model.decoder.embed_positions.weight");
    proj_in_ = optional_view(layout, params, "model.decoder.project_in.weight");
    dproj_in_ = optional_view(layout, grads, "model.decoder.project_in.weight");
    proj_out_ = optional_view(layout, params, "model.decoder.project_out.weight");
    dproj_out_ = optional_view(layout, grads, "model.decoder.project_out.weight");
    lnf_w_ = optional_view(layout, params, "model.decoder.final_layer_norm.weight");
    lnf_b_ = optional_view(layout, params, "model.decoder.final_layer_norm.bias");
    dlnf_w_ = optional_view(layout, grads, "model.decoder.final_layer_norm.weight");
    dlnf_b_ = optional_view(layout, grads, "model.decoder.final_layer_norm.bias");
    if (c.tie_word_embeddings) {
      head_ = embed_;
      dhead_ = dembed_;
    } else {
      head_ = layout.view(params, "lm_head.weight");
      dhead_ = layout.view(grads, "lm_head.weight");
    }
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = opt_layer_prefix(l);
      layers_.push_back(bind(layout, params, p));
      grads_.push_back(bind(layout, grads, p));
    }
    // Flat-buffer ranges for the grad-ready hook: the embeddings (and project_in) come before the
    // layers, the final norm, project_out and an untied head after them.
    embed_range_ = {0, layers_.empty() ? layout.total_numel() : layers_.front().begin};
    head_range_ = {layers_.empty() ? layout.total_numel() : layers_.back().end, layout.total_numel()};
  }

  double forward_backward(const Batch& b, float grad_scale, ExecContext& ctx) override {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq, L = c_.num_hidden_layers;
    std::vector<Acts> acts(static_cast<std::size_t>(L));
    Tensor emb_in;  // token embeddings before project_in (kept for its weight gradient)
    Tensor x = embed(b, emb_in, ctx);
    for (std::int64_t l = 0; l < L; ++l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      Tensor out = new_act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, /*training=*/true, ctx);
      if (opt_.activation_checkpointing) a.drop_all_but_input();
      x = out;
    }
    // Head: final LayerNorm, project_out, LM head and loss; then their backward.
    HeadActs h = head_forward(x, ctx);
    Tensor dxp = new_act({T, P_}, "head input gradient");
    LossSum ls;
    if (opt_.fused_kernels) {
      const std::int64_t count = count_target_tokens(b.targets);
      SCALELAB_CHECK(count > 0, "[opt] the batch has no target tokens to train on");
      ls = fused_linear_cross_entropy(dxp, dhead_, h.xp, head_, b.targets, grad_scale / static_cast<float>(count), 0,
                                      ctx);
    } else {
      Tensor logits = new_act({T, c_.vocab_size}, "logits");
      linear_forward(logits, h.xp, head_, nullptr, ctx);
      Tensor lse = new_f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      SCALELAB_CHECK(ls.count > 0, "[opt] the batch has no target tokens to train on");
      cross_entropy_backward(logits, logits, lse, b.targets, grad_scale / static_cast<float>(ls.count), ctx);
      linear_backward(&dxp, dhead_, nullptr, logits, h.xp, head_, ctx);
    }
    Tensor dx = head_backward(h, x, dxp, ctx);
    dxp = Tensor();
    h = HeadActs();
    x = Tensor();
    if (hook_ && head_range_.second > head_range_.first) hook_(head_range_.first, head_range_.second);
    for (std::int64_t l = L - 1; l >= 0; --l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      if (opt_.activation_checkpointing) {
        Tensor out = new_act({T, H_}, "recomputed residual");
        layer_forward(l, a.x, out, a, b, /*training=*/true, ctx);
      }
      layer_backward(l, dx, a, b, ctx);
      a = Acts();
      if (hook_) hook_(layers_[static_cast<std::size_t>(l)].begin, layers_[static_cast<std::size_t>(l)].end);
    }
    embed_backward(b, emb_in, dx, ctx);
    if (hook_) hook_(embed_range_.first, embed_range_.second);
    return ls.sum / static_cast<double>(ls.count);
  }

  double forward_loss(const Batch& b, ExecContext& ctx, Tensor* logits_out) override {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq;
    Tensor emb_in;
    Tensor x = embed(b, emb_in, ctx);
    emb_in = Tensor();
    for (std::int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      Acts a;
      Tensor out = new_act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, /*training=*/false, ctx);
      x = out;
    }
    HeadActs h = head_forward(x, ctx);
    LossSum ls;
    if (opt_.fused_kernels && logits_out == nullptr) {
      ls = fused_linear_cross_entropy_forward(h.xp, head_, b.targets, 0, ctx);
    } else {
      Tensor logits = new_act({T, c_.vocab_size}, "logits");
      linear_forward(logits, h.xp, head_, nullptr, ctx);
      Tensor lse = new_f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      if (logits_out) *logits_out = logits;
    }
    return ls.count ? ls.sum / static_cast<double>(ls.count) : 0.0;
  }

 private:
  struct Weights {
    Tensor ln1_w, ln1_b;  // self_attn_layer_norm (undefined without elementwise affine)
    Tensor wqkv, bqkv;    // [3H, H], [3H] (bias undefined without enable_bias)
    Tensor wo, bo;        // out_proj
    Tensor ln2_w, ln2_b;  // final_layer_norm (the layer's second LayerNorm)
    Tensor w1, b1, w2, b2;
    std::int64_t begin = 0, end = 0;  // the layer's range in the flat buffer
  };
  // What a layer keeps from forward for backward. Pre-LN: ln1 normalizes x into a_in, ln2
  // normalizes h into m_in. Post-LN: ln1 normalizes h into m_in, ln2 normalizes h2 into the
  // layer output.
  struct Acts {
    Tensor x;                  // layer input [T, H]
    Tensor mean1, rstd1;       // ln1 statistics [T] (fp32)
    Tensor a_in;               // pre-LN: ln1 output, the attention input [T, H]
    Tensor qkv;                // [T, 3H]
    Tensor probs;              // eager attention probabilities [B, nh, S, S]
    Tensor lse;                // flash attention log-sum-exp [B, nh, S] (fp32)
    Tensor attn;               // attention output [T, H]
    Tensor h;                  // x + dropout(out_proj(attn)) [T, H]
    Tensor mean2, rstd2;       // ln2 statistics [T]
    Tensor m_in;               // MLP input (a LayerNorm output) [T, H]
    Tensor pre;                // fc1 output before the activation [T, I] (unfused only)
    Tensor act;                // activation output [T, I]
    Tensor h2;                 // post-LN: MLP residual sum, ln2's input [T, H]
    void drop_all_but_input() {
      Tensor keep = x;
      *this = Acts();
      x = keep;
    }
  };
  struct HeadActs {
    Tensor meanf, rstdf;  // final LayerNorm statistics
    Tensor xf;            // final LayerNorm output (or the last layer's output when there is none)
    Tensor xp;            // project_out output (or xf), the LM head's input [T, P]
  };

  Weights bind(const ParamLayout& layout, Tensor& flat, const std::string& p) {
    Weights w;
    const ParamInfo& q = layout.at(p + "self_attn.q_proj.weight");
    const ParamInfo& v = layout.at(p + "self_attn.v_proj.weight");
    SCALELAB_CHECK(v.offset + v.numel - q.offset == 3 * H_ * H_, "[opt] q/k/v weights are not contiguous");
    Tensor flat1 = flat.view({flat.numel()});
    w.wqkv = flat1.slice(q.offset, q.offset + 3 * H_ * H_).view({3 * H_, H_});
    if (const ParamInfo* qb = layout.find(p + "self_attn.q_proj.bias")) {
      const ParamInfo& vb = layout.at(p + "self_attn.v_proj.bias");
      SCALELAB_CHECK(vb.offset + vb.numel - qb->offset == 3 * H_, "[opt] q/k/v biases are not contiguous");
      w.bqkv = flat1.slice(qb->offset, qb->offset + 3 * H_);
    }
    w.ln1_w = optional_view(layout, flat, p + "self_attn_layer_norm.weight");
    w.ln1_b = optional_view(layout, flat, p + "self_attn_layer_norm.bias");
    w.wo = layout.view(flat, p + "self_attn.out_proj.weight");
    w.bo = optional_view(layout, flat, p + "self_attn.out_proj.bias");
    w.ln2_w = optional_view(layout, flat, p + "final_layer_norm.weight");
    w.ln2_b = optional_view(layout, flat, p + "final_layer_norm.bias");
    w.w1 = layout.view(flat, p + "fc1.weight");
    w.b1 = optional_view(layout, flat, p + "fc1.bias");
    w.w2 = layout.view(flat, p + "fc2.weight");
    w.b2 = optional_view(layout, flat, p + "fc2.bias");
    w.begin = layout.total_numel();
    w.end = 0;
    for (const ParamInfo& pi : layout.params()) {
      if (pi.name.compare(0, p.size(), p) != 0) continue;
      w.begin = std::min(w.begin, pi.offset);
      w.end = std::max(w.end, pi.offset + pi.numel);
    }
    return w;
  }

  Tensor new_act(const Shape& s, const char* what) const {
    return Tensor::empty(s, opt_.activation_dtype, *alloc_, what);
  }
  Tensor new_f32(const Shape& s, const char* what) const { return Tensor::empty(s, DType::kF32, *alloc_, what); }

  void check_batch(const Batch& b) const {
    SCALELAB_CHECK(b.seq <= c_.max_position_embeddings,
                   "[opt] sequence length " + std::to_string(b.seq) + " exceeds max_position_embeddings " +
                       std::to_string(c_.max_position_embeddings));
  }

  DropoutKey key(std::int64_t layer, std::int64_t site) const { return {opt_.seed, step_, layer, site}; }
  float dropout_p() const { return static_cast<float>(opt_.dropout); }

  // x = project_in(embed_tokens[ids]) + embed_positions[pos + 2].
  Tensor embed(const Batch& b, Tensor& emb_in, ExecContext& ctx) {
    alloc_ = ctx.alloc;
    const std::int64_t T = b.batch * b.seq;
    Tensor x;
    if (proj_in_.defined()) {
      emb_in = new_act({T, P_}, "embeddings");
      embedding_forward(emb_in, b.inputs, embed_, ctx);
      x = new_act({T, H_}, "embeddings (projected)");
      linear_forward(x, emb_in, proj_in_, nullptr, ctx);
    } else {
      x = new_act({T, H_}, "embeddings");
      embedding_forward(x, b.inputs, embed_, ctx);
    }
    position_embedding_add_forward(x, pos_, b.seq, kPositionOffset, ctx);
    return x;
  }

  void embed_backward(const Batch& b, Tensor& emb_in, Tensor& dx, ExecContext& ctx) {
    const std::int64_t skip = c_.pad_token_id ? *c_.pad_token_id : -1;
    position_embedding_backward(dpos_, dx, b.seq, kPositionOffset, ctx);
    if (proj_in_.defined()) {
      Tensor de = new_act({b.batch * b.seq, P_}, "embedding gradient");
      linear_backward(&de, dproj_in_, nullptr, dx, emb_in, proj_in_, ctx);
      dx = Tensor();
      emb_in = Tensor();
      embedding_backward(dembed_, de, b.inputs, ctx, skip);
    } else {
      embedding_backward(dembed_, dx, b.inputs, ctx, skip);
    }
  }

  HeadActs head_forward(const Tensor& x, ExecContext& ctx) {
    const std::int64_t T = x.numel() / H_;
    HeadActs h;
    if (final_ln_) {
      h.meanf = new_f32({T}, "final norm mean");
      h.rstdf = new_f32({T}, "final norm rstd");
      h.xf = new_act({T, H_}, "final norm output");
      layernorm_forward(h.xf, h.meanf, h.rstdf, x, lnf_w_, lnf_b_, eps_, ctx);
    } else {
      h.xf = x;
    }
    if (proj_out_.defined()) {
      h.xp = new_act({T, P_}, "project_out output");
      linear_forward(h.xp, h.xf, proj_out_, nullptr, ctx);
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
    if (proj_out_.defined()) {
      dxf = new_act({T, H_}, "final norm gradient");
      linear_backward(&dxf, dproj_out_, nullptr, dxp, h.xf, proj_out_, ctx);
      dxp = Tensor();
      h.xp = Tensor();
    }
    if (!final_ln_) return dxf;
    Tensor dx = new_act({T, H_}, "residual gradient");
    layernorm_backward(dx, &dlnf_w_, &dlnf_b_, dxf, x, h.meanf, h.rstdf, lnf_w_, ctx);
    return dx;
  }

  AttentionShape attn_shape(const Batch& b) const {
    return {b.batch, b.seq, c_.num_attention_heads, c_.num_attention_heads, c_.head_dim};
  }
  float attn_scale() const { return 1.0f / std::sqrt(static_cast<float>(c_.head_dim)); }

  // y = ln(x) (plain) and its statistics.
  void norm(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& bias,
            ExecContext& ctx) {
    const std::int64_t T = x.numel() / H_;
    mean = new_f32({T}, "layernorm mean");
    rstd = new_f32({T}, "layernorm rstd");
    y = new_act({T, H_}, "layernorm output");
    layernorm_forward(y, mean, rstd, x, w, bias, eps_, ctx);
  }
  // h = base + delta (delta already in h) then y = ln(h): fused into one pass, or add + norm.
  void residual_norm(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& base, const Tensor& w,
                     const Tensor& bias, ExecContext& ctx) {
    const std::int64_t T = h.numel() / H_;
    mean = new_f32({T}, "layernorm mean");
    rstd = new_f32({T}, "layernorm rstd");
    if (!y.defined()) y = new_act({T, H_}, "layernorm output");
    if (opt_.fused_kernels) {
      layernorm_residual_forward(h, y, mean, rstd, base, h, w, bias, eps_, ctx);
    } else {
      add_(h, base, ctx);
      layernorm_forward(y, mean, rstd, h, w, bias, eps_, ctx);
    }
  }

  // MLP up to the activation: a.act (and a.pre unfused) from a.m_in.
  void mlp_up(Acts& a, const Weights& w, std::int64_t T, ExecContext& ctx) {
    if (opt_.fused_kernels) {
      a.act = new_act({T, I_}, "mlp activation");
      linear_forward(a.act, a.m_in, w.w1, nullptr, ctx);
      bias_relu_forward(a.act, a.act, w.b1, ctx);
    } else {
      a.pre = new_act({T, I_}, "mlp fc1 output");
      linear_forward(a.pre, a.m_in, w.w1, &w.b1, ctx);
      a.act = new_act({T, I_}, "mlp activation");
      activation_forward(a.act, a.pre, act_fn_, ctx);
    }
  }

  void attention_forward(Acts& a, const Tensor& in, const Weights& w, const Batch& b, bool training,
                         std::int64_t l, ExecContext& ctx) {
    const std::int64_t T = b.batch * b.seq;
    a.qkv = new_act({T, 3 * H_}, "qkv");
    linear_forward(a.qkv, in, w.wqkv, &w.bqkv, ctx);
    a.attn = new_act({T, H_}, "attention output");
    if (opt_.attention == AttentionImpl::kFlash) {
      a.lse = new_f32({b.batch, c_.num_attention_heads, b.seq}, "attention lse");
      attention_flash_forward(a.attn, a.lse, a.qkv, attn_shape(b), attn_scale(), ctx);
    } else {
      a.probs = new_act({b.batch, c_.num_attention_heads, b.seq, b.seq}, "attention scores");
      attention_eager_forward(a.attn, a.probs, a.qkv, attn_shape(b), attn_scale(), ctx);
    }
    a.h = new_act({T, H_}, "residual stream");
    linear_forward(a.h, a.attn, w.wo, &w.bo, ctx);
    if (training && opt_.dropout > 0) dropout_forward(a.h, dropout_p(), key(l, kSiteAttention), ctx);
  }

  void layer_forward(std::int64_t l, const Tensor& x, Tensor& out, Acts& a, const Batch& b, bool training,
                     ExecContext& ctx) {
    const Weights& w = layers_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq;
    const bool drop = training && opt_.dropout > 0;
    a.x = x;
    if (pre_ln_) {
      norm(a.a_in, a.mean1, a.rstd1, x, w.ln1_w, w.ln1_b, ctx);
      attention_forward(a, a.a_in, w, b, training, l, ctx);
      if (opt_.fused_kernels) a.a_in = Tensor();  // rebuilt in backward
      residual_norm(a.h, a.m_in, a.mean2, a.rstd2, x, w.ln2_w, w.ln2_b, ctx);
      mlp_up(a, w, T, ctx);
      if (opt_.fused_kernels) a.m_in = Tensor();
      linear_forward(out, a.act, w.w2, &w.b2, ctx);
      if (drop) dropout_forward(out, dropout_p(), key(l, kSiteMlp), ctx);
      add_(out, a.h, ctx);
    } else {
      attention_forward(a, x, w, b, training, l, ctx);
      residual_norm(a.h, a.m_in, a.mean1, a.rstd1, x, w.ln1_w, w.ln1_b, ctx);
      mlp_up(a, w, T, ctx);
      a.h2 = new_act({T, H_}, "residual stream");
      linear_forward(a.h2, a.act, w.w2, &w.b2, ctx);
      if (drop) dropout_forward(a.h2, dropout_p(), key(l, kSiteMlp), ctx);
      Tensor y = out;
      residual_norm(a.h2, y, a.mean2, a.rstd2, a.m_in, w.ln2_w, w.ln2_b, ctx);
      if (opt_.fused_kernels) a.m_in = Tensor();
    }
  }

  // The masked gradient of a dropout site: a new buffer when dropout is on, else g itself.
  Tensor dropout_grad(const Tensor& g, std::int64_t l, std::int64_t site, ExecContext& ctx) {
    if (!(opt_.dropout > 0)) return g;
    Tensor d = new_act(g.shape(), "dropout gradient");
    dropout_backward(d, g, dropout_p(), key(l, site), ctx);
    return d;
  }

  // From dout (gradient of the MLP's output delta, before dropout) to dact's use: fills da_in-side
  // gradient `dm` (assigned, or added when accumulate) of the MLP input; frees the MLP's acts.
  void mlp_backward(std::int64_t l, const Tensor& dout, Tensor& dm, bool accumulate, Acts& a, const Weights& w,
                    Weights& g, const Tensor& m_in_src, const Tensor& m_mean, const Tensor& m_rstd,
                    const Tensor& m_w, const Tensor& m_b, ExecContext& ctx) {
    const std::int64_t T = dout.numel() / H_;
    Tensor dd = dropout_grad(dout, l, kSiteMlp, ctx);
    Tensor dact = new_act({T, I_}, "mlp activation gradient");
    linear_backward(&dact, g.w2, &g.b2, dd, a.act, w.w2, ctx);
    dd = Tensor();
    if (opt_.fused_kernels) {
      bias_relu_backward(dact, &g.b1, dact, a.act, ctx);
      a.act = Tensor();
      Tensor m = new_act({T, H_}, "recomputed norm output");
      layernorm_recompute(m, m_in_src, m_mean, m_rstd, m_w, m_b, ctx);
      linear_backward(&dm, g.w1, nullptr, dact, m, w.w1, ctx, accumulate);
    } else {
      activation_backward(dact, dact, a.pre, act_fn_, ctx);
      a.act = Tensor();
      a.pre = Tensor();
      linear_backward(&dm, g.w1, &g.b1, dact, a.m_in, w.w1, ctx, accumulate);
    }
  }

  // dx holds the gradient of the layer's output on entry and of its input on return.
  void layer_backward(std::int64_t l, Tensor& dx, Acts& a, const Batch& b, ExecContext& ctx) {
    const Weights& w = layers_[static_cast<std::size_t>(l)];
    Weights& g = grads_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq;
    if (pre_ln_) {
      // out = h + drop(fc2(act(fc1(ln2(h))))),  h = x + drop(out_proj(attn(qkv(ln1(x))))).
      Tensor dy = new_act({T, H_}, "norm output gradient");
      mlp_backward(l, dx, dy, false, a, w, g, a.h, a.mean2, a.rstd2, w.ln2_w, w.ln2_b, ctx);
      layernorm_backward(dx, &g.ln2_w, &g.ln2_b, dy, a.h, a.mean2, a.rstd2, w.ln2_w, ctx, /*accumulate_dx=*/true);
      Tensor dqkv = attention_backward(l, dx, a, w, g, b, ctx);
      if (opt_.fused_kernels) {
        Tensor m = new_act({T, H_}, "recomputed norm output");
        layernorm_recompute(m, a.x, a.mean1, a.rstd1, w.ln1_w, w.ln1_b, ctx);
        linear_backward(&dy, g.wqkv, &g.bqkv, dqkv, m, w.wqkv, ctx);
      } else {
        linear_backward(&dy, g.wqkv, &g.bqkv, dqkv, a.a_in, w.wqkv, ctx);
      }
      dqkv = Tensor();
      layernorm_backward(dx, &g.ln1_w, &g.ln1_b, dy, a.x, a.mean1, a.rstd1, w.ln1_w, ctx, /*accumulate_dx=*/true);
    } else {
      // out = ln2(h2), h2 = m + drop(fc2(act(fc1(m)))), m = ln1(h), h = x + drop(out_proj(attn(qkv(x)))).
      Tensor dh2 = new_act({T, H_}, "residual gradient");
      layernorm_backward(dh2, &g.ln2_w, &g.ln2_b, dx, a.h2, a.mean2, a.rstd2, w.ln2_w, ctx);
      dx = dh2;  // the gradient of h2, and of m through the residual
      dh2 = Tensor();
      mlp_backward(l, dx, dx, true, a, w, g, a.h, a.mean1, a.rstd1, w.ln1_w, w.ln1_b, ctx);
      Tensor dh = new_act({T, H_}, "residual gradient");
      layernorm_backward(dh, &g.ln1_w, &g.ln1_b, dx, a.h, a.mean1, a.rstd1, w.ln1_w, ctx);
      dx = dh;  // the gradient of h, and of x through the residual
      dh = Tensor();
      Tensor dqkv = attention_backward(l, dx, a, w, g, b, ctx);
      linear_backward(&dx, g.wqkv, &g.bqkv, dqkv, a.x, w.wqkv, ctx, /*accumulate_dx=*/true);
    }
  }

  // From dh (gradient of the attention residual sum) to dqkv; frees the attention's acts.
  Tensor attention_backward(std::int64_t l, const Tensor& dh, Acts& a, const Weights& w, Weights& g, const Batch& b,
                            ExecContext& ctx) {
    const std::int64_t T = b.batch * b.seq;
    Tensor dd = dropout_grad(dh, l, kSiteAttention, ctx);
    Tensor dattn = new_act({T, H_}, "attention output gradient");
    linear_backward(&dattn, g.wo, &g.bo, dd, a.attn, w.wo, ctx);
    dd = Tensor();
    Tensor dqkv = new_act({T, 3 * H_}, "qkv gradient");
    if (opt_.attention == AttentionImpl::kFlash) {
      attention_flash_backward(dqkv, dattn, a.attn, a.lse, a.qkv, attn_shape(b), attn_scale(), ctx);
    } else {
      attention_eager_backward(dqkv, dattn, a.probs, a.qkv, attn_shape(b), attn_scale(), ctx);
    }
    dattn = Tensor();
    a.probs = Tensor();
    a.lse = Tensor();
    return dqkv;
  }

  ModelConfig c_;
  ModelOptions opt_;
  Activation act_fn_;
  std::int64_t H_ = 0, I_ = 0, P_ = 0;
  bool pre_ln_ = true, final_ln_ = true;
  float eps_ = 1e-5f;
  Tensor embed_, dembed_, pos_, dpos_, proj_in_, dproj_in_, proj_out_, dproj_out_;
  Tensor lnf_w_, lnf_b_, dlnf_w_, dlnf_b_, head_, dhead_;
  std::pair<std::int64_t, std::int64_t> embed_range_, head_range_;
  std::vector<Weights> layers_, grads_;
  DeviceAllocator* alloc_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> make_opt_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                      const ModelOptions& o) {
  return std::make_unique<OptModel>(c, layout, params, grads, o);
}

}  // namespace scalelab
