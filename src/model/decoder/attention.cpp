#include "model/decoder/attention.h"

#include <cmath>

namespace scalelab {

using namespace kernels;

void AttentionBlock::forward(AttentionActs& a, Tensor& h, Tensor& in, bool release_in, std::int64_t batch,
                             std::int64_t seq, const ActAlloc& alloc, ExecContext& ctx) const {
  const std::int64_t T = batch * seq, Q = n_heads * head_dim, ld = Q + 2 * n_kv_heads * head_dim;
  a.qkv = alloc.act({T, ld}, "qkv");
  qkv.forward(a.qkv, in, ctx);
  if (release_in) in = Tensor();
  if (rope) {
    rope_forward(a.qkv, 0, ld, n_heads, head_dim, seq, *rope, ctx);
    rope_forward(a.qkv, Q, ld, n_kv_heads, head_dim, seq, *rope, ctx);
  }
  a.attn = alloc.act({T, Q}, "attention output");
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (impl == AttentionImpl::kFlash) {
    a.lse = alloc.f32({batch, n_heads, seq}, "attention lse");
    attention_flash_forward(a.attn, a.lse, a.qkv, shape(batch, seq), scale, ctx);
  } else {
    a.probs = alloc.act({batch, n_heads, seq, seq}, "attention scores");
    attention_eager_forward(a.attn, a.probs, a.qkv, shape(batch, seq), scale, ctx);
  }
  h = alloc.act({T, out.out_features()}, "residual stream");
  out.forward(h, a.attn, ctx);
}

void AttentionBlock::forward_cached(AttentionActs& a, Tensor& h, const Tensor& in, KvCache& cache, std::int64_t layer,
                                    const ActAlloc& alloc, ExecContext& ctx) const {
  const std::int64_t T = in.dim(0), Q = n_heads * head_dim, ld = Q + 2 * n_kv_heads * head_dim;
  a.qkv = alloc.act({T, ld}, "qkv");
  qkv.forward(a.qkv, in, ctx);
  if (rope) {
    rope_rows_at(a.qkv, 0, ld, n_heads, head_dim, cache.length, *rope);
    rope_rows_at(a.qkv, Q, ld, n_kv_heads, head_dim, cache.length, *rope);
  }
  a.attn = alloc.act({T, Q}, "attention output");
  cached_attention(a.attn, a.qkv, cache, layer, n_heads, 1.0f / std::sqrt(static_cast<float>(head_dim)), ctx);
  h = alloc.act({T, out.out_features()}, "residual stream");
  out.forward(h, a.attn, ctx);
}

Tensor AttentionBlock::backward_to_qkv(Tensor& dout, AttentionActs& a, std::int64_t batch, std::int64_t seq,
                                       const ActAlloc& alloc, ExecContext& ctx) {
  const std::int64_t T = batch * seq, Q = n_heads * head_dim, ld = Q + 2 * n_kv_heads * head_dim;
  Tensor dattn = alloc.act({T, Q}, "attention output gradient");
  out.backward(&dattn, dout, a.attn, ctx);
  dout = Tensor();
  Tensor dqkv = alloc.act({T, ld}, "qkv gradient");
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (impl == AttentionImpl::kFlash) {
    attention_flash_backward(dqkv, dattn, a.attn, a.lse, a.qkv, shape(batch, seq), scale, ctx);
  } else {
    attention_eager_backward(dqkv, dattn, a.probs, a.qkv, shape(batch, seq), scale, ctx);
  }
  dattn = Tensor();
  a.probs = Tensor();
  a.lse = Tensor();
  if (rope) {
    rope_backward(dqkv, 0, ld, n_heads, head_dim, seq, *rope, ctx);
    rope_backward(dqkv, Q, ld, n_kv_heads, head_dim, seq, *rope, ctx);
  }
  return dqkv;
}

}  // namespace scalelab
