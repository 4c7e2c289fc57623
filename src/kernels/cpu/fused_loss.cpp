// Linear + cross-entropy over chunks of tokens (fused.h): the [tokens, vocab] logits never exist;
// one [chunk, vocab] buffer holds a chunk's logits, then in place their gradient.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/allocator.h"
#include "core/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/fused.h"
#include "kernels/kernel_common.h"
#include "kernels/matmul.h"

namespace scalelab::kernels {

namespace {

constexpr std::int64_t kTargetChunkBytes = std::int64_t{16} << 20;
constexpr std::int64_t kMinChunk = 64, kMaxChunk = 1024;

struct Dims {
  std::int64_t T, H, V, chunk;
};

Dims check(const Tensor& x, const Tensor& w, const Tensor& targets, std::int64_t chunk_tokens, const char* op) {
  require_cpu(x, op);
  require_cpu(w, op);
  require_dtype(x, DType::kF32, op, "input");
  require_dtype(w, DType::kF32, op, "weight");
  require_dtype(targets, DType::kI32, op, "targets");
  SCALELAB_CHECK(w.rank() == 2, std::string("[") + op + "] weight must be 2-D [vocab, hidden], got " + w.shape().str());
  const std::int64_t V = w.dim(0), H = w.dim(1);
  SCALELAB_CHECK(x.rank() >= 1 && x.dim(-1) == H,
                 std::string("[") + op + "] input " + x.shape().str() + " does not end in the hidden size " +
                     std::to_string(H));
  const std::int64_t T = x.numel() / H;
  require_numel(targets, T, op, "targets");
  const std::int32_t* tg = targets.data<std::int32_t>();
  for (std::int64_t r = 0; r < T; ++r) {
    if (tg[r] != kIgnoreIndex && (tg[r] < 0 || tg[r] >= V)) {
      throw InvalidInput(std::string("[") + op + "] target " + std::to_string(tg[r]) + " at row " + std::to_string(r) +
                         " is outside the vocabulary of " + std::to_string(V) +
                         " — the data does not match the model's vocab_size");
    }
  }
  return {T, H, V, fused_linear_cross_entropy_chunk(T, chunk_tokens, V)};
}

// Adds wall time to the profiler (the fused kernel does forward and backward work in one call,
// so it books each part to its phase instead of using one ProfileScope).
class PhaseClock {
 public:
  explicit PhaseClock(const ExecContext& ctx) : prof_(ctx.profiler) { mark(); }
  void book(Phase p) {
    if (!prof_) return;
    const auto now = std::chrono::steady_clock::now();
    prof_->add("loss", p, std::chrono::duration<double>(now - last_).count());
    last_ = now;
  }
  void mark() {
    if (prof_) last_ = std::chrono::steady_clock::now();
  }

 private:
  Profiler* prof_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

std::int64_t fused_linear_cross_entropy_default_chunk(std::int64_t vocab) {
  std::int64_t c = kMaxChunk;
  while (c > kMinChunk && c * std::max<std::int64_t>(vocab, 1) * 4 > kTargetChunkBytes) c /= 2;
  return c;
}

std::int64_t fused_linear_cross_entropy_chunk(std::int64_t tokens, std::int64_t chunk_tokens, std::int64_t vocab) {
  const std::int64_t c = chunk_tokens > 0 ? chunk_tokens : fused_linear_cross_entropy_default_chunk(vocab);
  return std::max<std::int64_t>(1, std::min(c, tokens));
}

std::size_t fused_linear_cross_entropy_workspace_bytes(std::int64_t chunk_tokens, std::int64_t vocab) {
  return DeviceAllocator::round_size(static_cast<std::size_t>(chunk_tokens) * static_cast<std::size_t>(vocab) *
                                     sizeof(float));
}

std::int64_t count_target_tokens(const Tensor& targets) {
  require_dtype(targets, DType::kI32, "count_target_tokens", "targets");
  const std::int32_t* tg = targets.data<std::int32_t>();
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < targets.numel(); ++r) n += tg[r] != kIgnoreIndex;
  return n;
}

LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& targets,
                                   float grad_scale_per_token, std::int64_t chunk_tokens, ExecContext& ctx) {
  const char* op = "fused_linear_cross_entropy";
  const Dims d = check(x, w, targets, chunk_tokens, op);
  const std::int64_t T = d.T, H = d.H, V = d.V;
  require_numel(dx, T * H, op, "input gradient");
  require_numel(dw, V * H, op, "weight gradient");
  LossSum out;
  if (T == 0) return out;
  PhaseClock clock(ctx);
  Tensor scratch = Tensor::empty({d.chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  float* L = scratch.f32();
  const float* xp = x.f32();
  const float* wp = w.f32();
  const std::int32_t* tg = targets.data<std::int32_t>();
  float* dxp = dx.f32();
  float* dwp = dw.f32();
  std::vector<double> row_loss(static_cast<std::size_t>(d.chunk));
  for (std::int64_t r0 = 0; r0 < T; r0 += d.chunk) {
    const std::int64_t c = std::min(d.chunk, T - r0);
    const std::int32_t* tc = tg + r0;
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < c; ++i) counted += tc[i] != kIgnoreIndex;
    if (counted == 0) {  // every row ignored: no loss, zero input gradient, nothing for dw
      std::fill(dxp + r0 * H, dxp + (r0 + c) * H, 0.0f);
      continue;
    }
    clock.mark();
    gemm(false, true, c, V, H, 1.0f, xp + r0 * H, H, wp, H, 0.0f, L, V);  // logits of the chunk
    // Per row: lse and loss; then, in place, (softmax − onehot) · scale. exp(z − max) is stored
    // during the sum and rescaled by 1/Σ, so each row sees one exp pass.
    parallel_for(c, 1, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        float* row = L + i * V;
        const std::int32_t t = tc[i];
        if (t == kIgnoreIndex) {
          std::fill(row, row + V, 0.0f);
          row_loss[static_cast<std::size_t>(i)] = 0.0;
          continue;
        }
        const float m = vec::max_of(row, V);
        const float target_logit = row[t];
        const float s = vec::exp_shift_sum(row, row, V, m);
        const float lse = m + std::log(s);
        row_loss[static_cast<std::size_t>(i)] = static_cast<double>(lse) - target_logit;
        const float k = grad_scale_per_token / s;
        for (std::int64_t j = 0; j < V; ++j) row[j] *= k;
        row[t] -= grad_scale_per_token;
      }
    });
    for (std::int64_t i = 0; i < c; ++i) {
      if (tc[i] == kIgnoreIndex) continue;
      out.sum += row_loss[static_cast<std::size_t>(i)];
      ++out.count;
    }
    clock.book(Phase::kForward);
    gemm(false, false, c, H, V, 1.0f, L, V, wp, H, 0.0f, dxp + r0 * H, H);       // dx_c = dL · w
    gemm(true, false, V, H, c, 1.0f, L, V, xp + r0 * H, H, 1.0f, dwp, H);        // dw += dLᵀ · x_c
    clock.book(Phase::kBackward);
  }
  return out;
}

LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                           std::int64_t chunk_tokens, ExecContext& ctx) {
  ProfileScope prof(ctx, "loss", Phase::kForward);
  const Dims d = check(x, w, targets, chunk_tokens, "fused_linear_cross_entropy_forward");
  const std::int64_t T = d.T, H = d.H, V = d.V;
  LossSum out;
  if (T == 0) return out;
  Tensor scratch = Tensor::empty({d.chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  float* L = scratch.f32();
  const float* xp = x.f32();
  const std::int32_t* tg = targets.data<std::int32_t>();
  std::vector<double> row_loss(static_cast<std::size_t>(d.chunk));
  for (std::int64_t r0 = 0; r0 < T; r0 += d.chunk) {
    const std::int64_t c = std::min(d.chunk, T - r0);
    const std::int32_t* tc = tg + r0;
    gemm(false, true, c, V, H, 1.0f, xp + r0 * H, H, w.f32(), H, 0.0f, L, V);
    parallel_for(c, 1, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        if (tc[i] == kIgnoreIndex) continue;
        const float* row = L + i * V;
        const float m = vec::max_of(row, V);
        const float lse = m + std::log(vec::exp_shift_sum(row, V, m));
        row_loss[static_cast<std::size_t>(i)] = static_cast<double>(lse) - row[tc[i]];
      }
    });
    for (std::int64_t i = 0; i < c; ++i) {
      if (tc[i] == kIgnoreIndex) continue;
      out.sum += row_loss[static_cast<std::size_t>(i)];
      ++out.count;
    }
  }
  return out;
}

}  // namespace scalelab::kernels
