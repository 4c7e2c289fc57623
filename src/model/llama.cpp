// The Llama family (Llama 3.x): RMSNorm, grouped-query attention with RoPE (llama3 scaling),
// SwiGLU MLP, tied or untied LM head. Explicit forward and backward per layer over the kernels of
// src/kernels; parameters and gradients are views into the flat buffers.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "model/model.h"

namespace scalelab {

namespace {

using namespace kernels;

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads, const ModelOptions& o)
      : c_(c), opt_(o), rope_(make_rope_table(c.head_dim, c.max_position_embeddings, c.rope_theta, c.rope_scaling)) {
    H_ = c.hidden_size;
    I_ = c.intermediate_size;
    Q_ = c.q_dim();
    KV_ = c.kv_dim();
    embed_ = layout.view(params, "model.embed_tokens.weight");
    dembed_ = layout.view(grads, "model.embed_tokens.weight");
    norm_ = layout.view(params, "model.norm.weight");
    dnorm_ = layout.view(grads, "model.norm.weight");
    const ParamInfo& emb = layout.at("model.embed_tokens.weight");
    embed_range_ = {emb.offset, emb.offset + emb.numel};
    const ParamInfo& nrm = layout.at("model.norm.weight");
    head_range_ = {nrm.offset, nrm.offset + nrm.numel};
    if (c.tie_word_embeddings) {
      head_ = embed_;
      dhead_ = dembed_;
    } else {
      head_ = layout.view(params, "lm_head.weight");
      dhead_ = layout.view(grads, "lm_head.weight");
      head_range_.second = layout.at("lm_head.weight").offset + layout.at("lm_head.weight").numel;
    }
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = llama_layer_prefix(l);
      layers_.push_back(bind(layout, params, p));
      grads_.push_back(bind(layout, grads, p));
    }
  }

  double forward_backward(const Batch& b, float grad_scale, ExecContext& ctx) override {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq, L = c_.num_hidden_layers;
    std::vector<Acts> acts(static_cast<std::size_t>(L));
    Tensor x = embed(b, ctx);
    for (std::int64_t l = 0; l < L; ++l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      Tensor out = new_act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, ctx);
      if (opt_.activation_checkpointing) a.drop_all_but_input();
      x = out;
    }
    // Head: final norm, LM head, loss, and at once their backward. Unfused: the [T, vocab]
    // logits exist (their gradient is written in place); fused: chunk by chunk, never whole.
    Tensor xf = new_act({T, H_}, "final norm output"), rstdf = new_f32({T}, "final norm rstd");
    rmsnorm_forward(xf, rstdf, x, norm_, static_cast<float>(c_.rms_norm_eps), ctx);
    LossSum ls;
    Tensor dxf;
    if (opt_.fused_kernels) {
      const std::int64_t n = count_target_tokens(b.targets);
      SCALELAB_CHECK(n > 0, "[llama] the batch has no target tokens to train on");
      dxf = new_act({T, H_}, "final norm gradient");
      ls = fused_linear_cross_entropy(dxf, dhead_, xf, head_, b.targets, grad_scale / static_cast<float>(n), 0, ctx);
    } else {
      Tensor logits = new_act({T, c_.vocab_size}, "logits");
      linear_forward(logits, xf, head_, nullptr, ctx);
      Tensor lse = new_f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      SCALELAB_CHECK(ls.count > 0, "[llama] the batch has no target tokens to train on");
      cross_entropy_backward(logits, logits, lse, b.targets, grad_scale / static_cast<float>(ls.count), ctx);
      dxf = new_act({T, H_}, "final norm gradient");
      linear_backward(&dxf, dhead_, nullptr, logits, xf, head_, ctx);
    }
    Tensor dx = new_act({T, H_}, "residual gradient");
    rmsnorm_backward(dx, dnorm_, dxf, x, rstdf, norm_, ctx);
    dxf = Tensor();
    xf = Tensor();
    if (hook_) hook_(head_range_.first, head_range_.second);
    for (std::int64_t l = L - 1; l >= 0; --l) {
      Acts& a = acts[static_cast<std::size_t>(l)];
      if (opt_.activation_checkpointing) {
        Tensor out = new_act({T, H_}, "recomputed residual");
        layer_forward(l, a.x, out, a, b, ctx);
      }
      layer_backward(l, dx, a, b, ctx);
      a = Acts();
      if (hook_) hook_(layers_[static_cast<std::size_t>(l)].begin, layers_[static_cast<std::size_t>(l)].end);
    }
    embedding_backward(dembed_, dx, b.inputs, ctx);
    if (hook_) hook_(embed_range_.first, embed_range_.second);
    return ls.sum / static_cast<double>(ls.count);
  }

  double forward_loss(const Batch& b, ExecContext& ctx, Tensor* logits_out) override {
    check_batch(b);
    const std::int64_t T = b.batch * b.seq;
    Tensor x = embed(b, ctx);
    for (std::int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      Acts a;
      Tensor out = new_act({T, H_}, "residual stream");
      layer_forward(l, x, out, a, b, ctx);
      x = out;
    }
    Tensor xf = new_act({T, H_}, "final norm output"), rstdf = new_f32({T}, "final norm rstd");
    rmsnorm_forward(xf, rstdf, x, norm_, static_cast<float>(c_.rms_norm_eps), ctx);
    LossSum ls;
    if (opt_.fused_kernels && logits_out == nullptr) {
      ls = fused_linear_cross_entropy_forward(xf, head_, b.targets, 0, ctx);
    } else {
      Tensor logits = new_act({T, c_.vocab_size}, "logits");
      linear_forward(logits, xf, head_, nullptr, ctx);
      Tensor lse = new_f32({T}, "loss lse");
      ls = cross_entropy_forward(lse, logits, b.targets, ctx);
      if (logits_out) *logits_out = logits;
    }
    return ls.count ? ls.sum / static_cast<double>(ls.count) : 0.0;
  }

 private:
  struct Weights {
    Tensor ln1, wqkv, wo, ln2, wgu, wdown;
    std::int64_t begin = 0, end = 0;  // the layer's range in the flat buffer
  };
  // What a layer keeps from forward for backward.
  struct Acts {
    Tensor x;      // layer input (residual stream) [T, H]
    Tensor rstd1;  // [T]
    Tensor y1;     // input_layernorm output [T, H] (fused: rebuilt in backward)
    Tensor qkv;    // q, k (after RoPE), v [T, Q + 2KV]
    Tensor probs;  // eager attention probabilities [B, nh, S, S]
    Tensor lse;    // flash attention log-sum-exp [B, nh, S] (fp32)
    Tensor attn;   // attention output [T, Q]
    Tensor h;      // residual after attention [T, H]
    Tensor rstd2;  // [T]
    Tensor y2;     // post_attention_layernorm output [T, H] (fused: rebuilt in backward)
    Tensor gu;     // gate and up projections [T, 2I]
    Tensor act;    // silu(gate) * up [T, I] (fused: not kept, recomputed in backward)
    void drop_all_but_input() {
      Tensor keep = x;
      *this = Acts();
      x = keep;
    }
  };

  Weights bind(const ParamLayout& layout, Tensor& flat, const std::string& p) {
    Weights w;
    const ParamInfo& q = layout.at(p + "self_attn.q_proj.weight");
    const ParamInfo& v = layout.at(p + "self_attn.v_proj.weight");
    const ParamInfo& g = layout.at(p + "mlp.gate_proj.weight");
    const ParamInfo& u = layout.at(p + "mlp.up_proj.weight");
    SCALELAB_CHECK(v.offset + v.numel - q.offset == (Q_ + 2 * KV_) * H_ && u.offset == g.offset + g.numel,
                   "[llama] q/k/v or gate/up are not contiguous in the parameter layout");
    Tensor flat1 = flat.view({flat.numel()});
    w.ln1 = layout.view(flat, p + "input_layernorm.weight");
    w.wqkv = flat1.slice(q.offset, q.offset + (Q_ + 2 * KV_) * H_).view({Q_ + 2 * KV_, H_});
    w.wo = layout.view(flat, p + "self_attn.o_proj.weight");
    w.ln2 = layout.view(flat, p + "post_attention_layernorm.weight");
    w.wgu = flat1.slice(g.offset, g.offset + 2 * I_ * H_).view({2 * I_, H_});
    w.wdown = layout.view(flat, p + "mlp.down_proj.weight");
    const ParamInfo& first = layout.at(p + "input_layernorm.weight");
    const ParamInfo& last = layout.at(p + "mlp.down_proj.weight");
    w.begin = first.offset;
    w.end = last.offset + last.numel;
    return w;
  }

  // Activations and activation gradients are stored in the activation dtype; per-row statistics
  // (rstd, lse) stay fp32.
  Tensor new_act(const Shape& s, const char* what) const {
    return Tensor::empty(s, opt_.activation_dtype, *alloc_, what);
  }
  Tensor new_f32(const Shape& s, const char* what) const { return Tensor::empty(s, DType::kF32, *alloc_, what); }

  void check_batch(const Batch& b) {
    SCALELAB_CHECK(b.seq <= c_.max_position_embeddings,
                   "[llama] sequence length " + std::to_string(b.seq) + " exceeds max_position_embeddings " +
                       std::to_string(c_.max_position_embeddings));
  }

  Tensor embed(const Batch& b, ExecContext& ctx) {
    alloc_ = ctx.alloc;
    Tensor x = new_act({b.batch * b.seq, H_}, "embeddings");
    embedding_forward(x, b.inputs, embed_, ctx);
    return x;
  }

  AttentionShape attn_shape(const Batch& b) const {
    return {b.batch, b.seq, c_.num_attention_heads, c_.num_key_value_heads, c_.head_dim};
  }

  void layer_forward(std::int64_t l, const Tensor& x, Tensor& out, Acts& a, const Batch& b, ExecContext& ctx) {
    const Weights& w = layers_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq, ld = Q_ + 2 * KV_;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const bool fused = opt_.fused_kernels;
    a.x = x;
    a.rstd1 = new_f32({T}, "rmsnorm rstd");
    a.y1 = new_act({T, H_}, "attention norm output");
    rmsnorm_forward(a.y1, a.rstd1, x, w.ln1, eps, ctx);
    a.qkv = new_act({T, ld}, "qkv");
    linear_forward(a.qkv, a.y1, w.wqkv, nullptr, ctx);
    if (fused) a.y1 = Tensor();  // rebuilt from x and rstd1 in backward
    rope_forward(a.qkv, 0, ld, c_.num_attention_heads, c_.head_dim, b.seq, rope_, ctx);
    rope_forward(a.qkv, Q_, ld, c_.num_key_value_heads, c_.head_dim, b.seq, rope_, ctx);
    const auto s = attn_shape(b);
    a.attn = new_act({T, Q_}, "attention output");
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    if (opt_.attention == AttentionImpl::kFlash) {
      a.lse = new_f32({b.batch, c_.num_attention_heads, b.seq}, "attention lse");
      attention_flash_forward(a.attn, a.lse, a.qkv, s, scale, ctx);
    } else {
      a.probs = new_act({b.batch, c_.num_attention_heads, b.seq, b.seq}, "attention scores");
      attention_eager_forward(a.attn, a.probs, a.qkv, s, scale, ctx);
    }
    a.h = new_act({T, H_}, "residual stream");
    linear_forward(a.h, a.attn, w.wo, nullptr, ctx);
    a.rstd2 = new_f32({T}, "rmsnorm rstd");
    a.y2 = new_act({T, H_}, "mlp norm output");
    if (fused) {
      // h = x + o_proj(attn) and y2 = rmsnorm(h) in one pass (h written over the projection).
      rmsnorm_residual_forward(a.h, a.y2, a.rstd2, x, a.h, w.ln2, eps, ctx);
    } else {
      add_(a.h, x, ctx);
      rmsnorm_forward(a.y2, a.rstd2, a.h, w.ln2, eps, ctx);
    }
    a.gu = new_act({T, 2 * I_}, "mlp gate/up");
    linear_forward(a.gu, a.y2, w.wgu, nullptr, ctx);
    if (fused) a.y2 = Tensor();  // rebuilt from h and rstd2 in backward
    a.act = new_act({T, I_}, "mlp activation");
    swiglu_forward(a.act, a.gu, ctx);
    linear_forward(out, a.act, w.wdown, nullptr, ctx);
    if (fused) a.act = Tensor();  // recomputed in backward
    add_(out, a.h, ctx);
  }

  // dx holds the gradient of the layer's output on entry and of its input on return.
  void layer_backward(std::int64_t l, Tensor& dx, Acts& a, const Batch& b, ExecContext& ctx) {
    const Weights& w = layers_[static_cast<std::size_t>(l)];
    Weights& g = grads_[static_cast<std::size_t>(l)];
    const std::int64_t T = b.batch * b.seq, ld = Q_ + 2 * KV_;
    const bool fused = opt_.fused_kernels;
    // MLP: out = h + down(swiglu(gate_up(rmsnorm(h)))).
    Tensor dgu;
    if (fused) {
      // dact, the recomputed activation and dW_down in one kernel; dgu is written over gu.
      swiglu_down_backward_recompute(a.gu, g.wdown, dx, a.gu, w.wdown, ctx);
      dgu = a.gu;
      a.y2 = new_act({T, H_}, "mlp norm output (recomputed)");
      rmsnorm_recompute(a.y2, a.h, a.rstd2, w.ln2, ctx);
    } else {
      Tensor dact = new_act({T, I_}, "mlp activation gradient");
      linear_backward(&dact, g.wdown, nullptr, dx, a.act, w.wdown, ctx);
      a.act = Tensor();
      dgu = new_act({T, 2 * I_}, "mlp gate/up gradient");
      swiglu_backward(dgu, dact, a.gu, ctx);
    }
    Tensor dy = new_act({T, H_}, "norm output gradient");
    linear_backward(&dy, g.wgu, nullptr, dgu, a.y2, w.wgu, ctx);
    dgu = Tensor();
    a.gu = Tensor();
    a.y2 = Tensor();
    if (fused) {
      rmsnorm_residual_backward(dx, g.ln2, dy, a.h, a.rstd2, w.ln2, ctx);  // dx is now dh
    } else {
      rmsnorm_backward(dx, g.ln2, dy, a.h, a.rstd2, w.ln2, ctx, /*accumulate_dx=*/true);  // dx is now dh
    }
    // Attention: h = x + o_proj(attention(rope(qkv(rmsnorm(x))))).
    Tensor dattn = new_act({T, Q_}, "attention output gradient");
    linear_backward(&dattn, g.wo, nullptr, dx, a.attn, w.wo, ctx);
    Tensor dqkv = new_act({T, ld}, "qkv gradient");
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    if (opt_.attention == AttentionImpl::kFlash) {
      attention_flash_backward(dqkv, dattn, a.attn, a.lse, a.qkv, attn_shape(b), scale, ctx);
    } else {
      attention_eager_backward(dqkv, dattn, a.probs, a.qkv, attn_shape(b), scale, ctx);
    }
    dattn = Tensor();
    a.probs = Tensor();
    a.lse = Tensor();
    rope_backward(dqkv, 0, ld, c_.num_attention_heads, c_.head_dim, b.seq, rope_, ctx);
    rope_backward(dqkv, Q_, ld, c_.num_key_value_heads, c_.head_dim, b.seq, rope_, ctx);
    if (fused) {
      a.y1 = new_act({T, H_}, "attention norm output (recomputed)");
      rmsnorm_recompute(a.y1, a.x, a.rstd1, w.ln1, ctx);
    }
    linear_backward(&dy, g.wqkv, nullptr, dqkv, a.y1, w.wqkv, ctx);
    a.y1 = Tensor();
    dqkv = Tensor();
    if (fused) {
      rmsnorm_residual_backward(dx, g.ln1, dy, a.x, a.rstd1, w.ln1, ctx);
    } else {
      rmsnorm_backward(dx, g.ln1, dy, a.x, a.rstd1, w.ln1, ctx, /*accumulate_dx=*/true);
    }
  }

  ModelConfig c_;
  ModelOptions opt_;
  RopeTable rope_;
  std::int64_t H_ = 0, I_ = 0, Q_ = 0, KV_ = 0;
  Tensor embed_, dembed_, norm_, dnorm_, head_, dhead_;
  std::pair<std::int64_t, std::int64_t> embed_range_, head_range_;
  std::vector<Weights> layers_, grads_;
  DeviceAllocator* alloc_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> make_llama_model(const ModelConfig& c, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                        const ModelOptions& o) {
  return std::make_unique<LlamaModel>(c, layout, params, grads, o);
}

}  // namespace scalelab
