#include "model/decoder/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/parallel.h"

namespace scalelab {

KvCache KvCache::allocate(const ModelConfig& c, std::int64_t max_len, DeviceAllocator& alloc) {
  KvCache kv;
  kv.max_len = max_len;
  kv.n_kv_heads = c.num_key_value_heads;
  kv.head_dim = c.head_dim;
  const std::int64_t width = kv.n_kv_heads * kv.head_dim;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    kv.k.push_back(Tensor::empty({max_len, width}, DType::kF32, alloc, "kv cache"));
    kv.v.push_back(Tensor::empty({max_len, width}, DType::kF32, alloc, "kv cache"));
  }
  return kv;
}

std::size_t KvCache::bytes(const ModelConfig& c, std::int64_t max_len) {
  return static_cast<std::size_t>(2 * c.num_hidden_layers * max_len * c.num_key_value_heads * c.head_dim) *
         sizeof(float);
}

namespace {

void check_cpu_f32(const Tensor& t, const char* what) {
  if (t.device() != DeviceType::kCPU || t.dtype() != DType::kF32) {
    throw InvalidInput(std::string("[generate] ") + what +
                       ": decoding with the KV cache runs on the CPU in fp32 for now — use --device cpu");
  }
}

}  // namespace

void rope_rows_at(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                  std::int64_t pos0, const kernels::RopeTable& table) {
  check_cpu_f32(x, "rope");
  const std::int64_t n = x.numel() / ld, half = head_dim / 2;
  SCALELAB_CHECK(half == table.half, "[generate] head_dim does not match the rope table");
  if (pos0 + n > table.max_positions) {
    throw InvalidInput("[generate] position " + std::to_string(pos0 + n - 1) +
                       " is past max_position_embeddings " + std::to_string(table.max_positions) +
                       " — use a shorter prompt or fewer --max-new-tokens");
  }
  float* base = x.f32();
  for (std::int64_t t = 0; t < n; ++t) {
    const float* c = table.cos.data() + (pos0 + t) * half;
    const float* s = table.sin.data() + (pos0 + t) * half;
    for (std::int64_t h = 0; h < n_heads; ++h) {
      float* p = base + t * ld + col + h * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const float x1 = p[i], x2 = p[i + half];
        p[i] = x1 * c[i] - x2 * s[i];
        p[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

void cached_attention(Tensor& out, const Tensor& qkv, KvCache& cache, std::int64_t layer, std::int64_t n_heads,
                      float scale, ExecContext& /*ctx*/) {
  check_cpu_f32(qkv, "attention");
  check_cpu_f32(out, "attention");
  const std::int64_t nkv = cache.n_kv_heads, hd = cache.head_dim, Q = n_heads * hd, KV = nkv * hd;
  const std::int64_t ld = Q + 2 * KV, n = qkv.numel() / ld, len0 = cache.length;
  if (len0 + n > cache.max_len) {
    throw InvalidInput("[generate] the KV cache holds " + std::to_string(cache.max_len) + " positions and " +
                       std::to_string(len0 + n) + " are needed — raise the cache length (--max-new-tokens)");
  }
  float* K = cache.k[static_cast<std::size_t>(layer)].f32();
  float* V = cache.v[static_cast<std::size_t>(layer)].f32();
  const float* src = qkv.f32();
  for (std::int64_t t = 0; t < n; ++t) {
    std::memcpy(K + (len0 + t) * KV, src + t * ld + Q, static_cast<std::size_t>(KV) * sizeof(float));
    std::memcpy(V + (len0 + t) * KV, src + t * ld + Q + KV, static_cast<std::size_t>(KV) * sizeof(float));
  }
  float* o = out.f32();
  const std::int64_t group = n_heads / nkv, tasks = n * n_heads;
  // Each (row, head) task writes its own output slice; the scores live on the task's stack frame.
  parallel_for(tasks, std::max<std::int64_t>(1, row_grain((len0 + n) * hd)), [&](std::int64_t b, std::int64_t e) {
    std::vector<float> score(static_cast<std::size_t>(len0 + n));
    for (std::int64_t task = b; task < e; ++task) {
      const std::int64_t t = task / n_heads, h = task % n_heads, g = h / group, keys = len0 + t + 1;
      const float* q = src + t * ld + h * hd;
      float mx = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < keys; ++j) {
        const float* k = K + j * KV + g * hd;
        float dot = 0;
        for (std::int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
        score[static_cast<std::size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      float sum = 0;
      for (std::int64_t j = 0; j < keys; ++j) {
        const float p = std::exp(score[static_cast<std::size_t>(j)] - mx);
        score[static_cast<std::size_t>(j)] = p;
        sum += p;
      }
      float* y = o + t * Q + h * hd;
      std::fill(y, y + hd, 0.0f);
      const float inv = 1.0f / sum;
      for (std::int64_t j = 0; j < keys; ++j) {
        const float p = score[static_cast<std::size_t>(j)] * inv;
        const float* v = V + j * KV + g * hd;
        for (std::int64_t i = 0; i < hd; ++i) y[i] += p * v[i];
      }
    }
  });
}

}  // namespace scalelab
