#pragma once
// Causal self-attention with grouped-query heads (attention family).
//
// Inputs are packed per token, as one QKV GEMM produces them: row t of qkv[B*S, (nh + 2*nkv)*hd]
// holds nh query heads, then nkv key heads, then nkv value heads. Query head h reads key/value
// head h / (nh / nkv); repeated K/V are never materialized.
//
// Eager attention (the baseline, as Hugging Face's "eager"): materializes the probabilities
//   P[b, h] = softmax(scale · Q K^T + causal mask)   (saved [B, nh, S, S] for backward)
//   out[b, s, h*hd:(h+1)*hd] = P V
// attention_backward assigns dqkv (all three parts) from dout; nothing accumulates.
// Tensors may be fp32, bf16 or fp16; scores, softmax and products are computed in fp32 and the
// probabilities are stored (and reused in backward) in the dtype of `probs`.
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

struct AttentionShape {
  std::int64_t batch = 0, seq = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  std::int64_t qkv_width() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
  std::int64_t out_width() const { return n_heads * head_dim; }
};

void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                             ExecContext& ctx);
void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                              const AttentionShape& s, float scale, ExecContext& ctx);

// Bytes of per-thread scratch the eager kernels allocate (for the memory plan), for tensors of
// dtype `act` (fp32 needs only the backward's dP block; low precision stages Q/K/V in fp32).
std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads);
std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads, DType act);
std::size_t attention_eager_forward_workspace_bytes(const AttentionShape& s, int threads, DType act);
std::size_t attention_eager_backward_workspace_bytes(const AttentionShape& s, int threads, DType act);

}  // namespace scalelab::kernels
