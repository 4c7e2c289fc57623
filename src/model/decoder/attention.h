#pragma once
// The attention block shared by the decoder families: a fused q/k/v projection (with or without
// biases), RoPE on q and k (Llama, Qwen2) or none (OPT), causal attention (eager: the S×S
// probabilities are kept; flash: only the log-sum-exp), and the output projection.
#include "kernels/attention.h"
#include "kernels/rope.h"
#include "model/decoder/kv_cache.h"
#include "model/decoder/linear.h"
#include "model/model.h"

namespace scalelab {

// What the block keeps for backward.
struct AttentionActs {
  Tensor qkv;    // q, k (after RoPE), v [T, (nh + 2·nkv)·hd]
  Tensor probs;  // eager: probabilities [B, nh, S, S]
  Tensor lse;    // flash: log-sum-exp [B, nh, S] (fp32)
  Tensor attn;   // attention output [T, nh·hd], the output projection's input
};

struct AttentionBlock {
  Linear qkv;  // [(nh + 2·nkv)·hd, in] over adjacent q/k/v weights (and biases)
  Linear out;  // [H, nh·hd]
  std::int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  const kernels::RopeTable* rope = nullptr;  // null: no rotary embedding
  AttentionImpl impl = AttentionImpl::kEager;

  // h = out(attention(rope(qkv(in)))). Allocates, in order, a.qkv ("qkv"), a.attn ("attention
  // output"), a.lse ("attention lse") or a.probs ("attention scores"), and h ("residual
  // stream"). release_in: drops the caller's `in` right after the q/k/v projection (a norm output
  // that backward rebuilds).
  void forward(AttentionActs& a, Tensor& h, Tensor& in, bool release_in, std::int64_t batch, std::int64_t seq,
               const ActAlloc& alloc, ExecContext& ctx) const;
  // Inference: the same for the rows of `in` [n, H] at positions [cache.length, cache.length + n),
  // RoPE at those positions, their keys and values appended to `layer` of the cache, attention over
  // the whole cache (cached_attention). a.qkv and a.attn are allocated as in forward.
  void forward_cached(AttentionActs& a, Tensor& h, const Tensor& in, KvCache& cache, std::int64_t layer,
                      const ActAlloc& alloc, ExecContext& ctx) const;
  // From dout (gradient of h's projection output) to the q/k/v gradient, returned (before the
  // q/k/v projection's backward, RoPE undone): allocates "attention output gradient" and "qkv
  // gradient"; drops the caller's dout after the output projection's backward and the block's
  // probabilities / lse after the attention backward. The caller runs qkv.backward.
  Tensor backward_to_qkv(Tensor& dout, AttentionActs& a, std::int64_t batch, std::int64_t seq,
                         const ActAlloc& alloc, ExecContext& ctx);

  kernels::AttentionShape shape(std::int64_t batch, std::int64_t seq) const {
    return {batch, seq, n_heads, n_kv_heads, head_dim};
  }
};

}  // namespace scalelab
