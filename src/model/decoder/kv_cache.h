#pragma once
// The key/value cache of inference (scalelab generate): per layer, the keys (after RoPE) and the
// values of every position seen so far, so that each new token costs one row through the model
// instead of the whole sequence again. One sequence (batch 1); fp32.
//
// The cache is allocated up front for max_len positions through the run's allocator (label "kv
// cache"), so the memory it needs is known before generation starts (kv_cache_bytes) and a too
// long --max-new-tokens is an out-of-memory error at allocation, never mid-answer.
//
// The attention over the cache is written here, CPU and fp32 only: the training kernels
// (kernels/attention.h) attend a whole causal sequence from position 0, while decoding attends
// n new queries at positions [len, len + n) to keys [0, len + n). The work per generated token is
// O(len · heads · head_dim), small beside the projections' GEMMs, so a plain loop parallel over
// heads is enough for now; a CUDA form belongs in kernels/ beside the training kernels.
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/rope.h"
#include "model/config.h"

namespace scalelab {

struct KvCache {
  std::int64_t max_len = 0, n_kv_heads = 0, head_dim = 0;
  std::int64_t length = 0;    // positions held (the next token's position)
  std::vector<Tensor> k, v;   // per layer [max_len, n_kv_heads * head_dim], fp32

  // Allocates the cache of `config` for max_len positions (throws OutOfMemory as any allocation).
  static KvCache allocate(const ModelConfig& config, std::int64_t max_len, DeviceAllocator& alloc);
  // Bytes the cache's tensors hold: 2 · layers · max_len · kv_heads · head_dim · 4.
  static std::size_t bytes(const ModelConfig& config, std::int64_t max_len);
  // Forgets the positions (the memory stays allocated).
  void clear() { length = 0; }
};

// Rotates, in place, n_heads heads of head_dim starting at column `col` of each of the n rows of
// `x` (row stride ld), row t being at position pos0 + t: the rotation of kernels::rope_forward.
void rope_rows_at(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                  std::int64_t pos0, const kernels::RopeTable& table);

// Appends the keys and values of the n rows of qkv [n, (nh + 2·nkv)·hd] (q, then k, then v per row,
// as the fused projection writes them) at positions [cache.length, cache.length + n) of `layer`,
// then writes out[n, nh·hd] = softmax(scale · q kᵀ) v over keys [0, cache.length + t] for row t
// (causal), query head h reading kv head h / (nh / nkv). Does not advance cache.length (the model
// does, once all layers ran). Throws InvalidInput past max_len.
void cached_attention(Tensor& out, const Tensor& qkv, KvCache& cache, std::int64_t layer, std::int64_t n_heads,
                      float scale, ExecContext& ctx);

}  // namespace scalelab
