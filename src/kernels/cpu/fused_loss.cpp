// Linear + cross-entropy over chunks of tokens (fused.h): the [tokens, vocab] logits never exist;
// one [chunk, vocab] buffer holds a chunk's logits, then in place their gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/fused.h"
#include "kernels/matmul.h"

namespace scalelab::kernels::cpu {

namespace {

struct Dims {
  std::int64_t T, H, V, chunk;
};

// The sizes of a call the front has validated, after the check that needs the targets' values:
// a target outside [0, V) throws before any output is touched.
Dims dims(const Tensor& x, const Tensor& w, const Tensor& targets, std::int64_t chunk_tokens, const char* op) {
  const std::int64_t V = w.dim(0), H = w.dim(1), T = x.numel() / H;
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

// The work of one call, split over threads by vocabulary: thread t owns rows [v0_t, v1_t) of w and
// dw and the same columns of the chunk's logits. BLAS runs single-threaded inside the parallel
// region (the OpenMP OpenBLAS does so by itself), so the only synchronization is two or three
// barriers per chunk instead of BLAS's internal ones in three multi-threaded GEMMs per chunk,
// which on a busy machine cost more than the GEMMs lose by being split. Per chunk of c rows:
//   1. each thread: L[:, own] = x_c · w_ownᵀ; per row the max m_t and Σ exp(L − m_t) of its
//      columns, storing exp(L − m_t) in place; the target logit if the target is its own.
//   -- barrier --
//   2. each thread: per row M = max_t m_t, S = Σ_t s_t·exp(m_t − M) (all threads combine in the
//      same order, so they agree bit for bit); L[:, own] *= scale·exp(m_t − M)/S, minus scale at
//      the target: (softmax − onehot)·scale. dw_own += L[:, own]ᵀ · x_c (disjoint rows of dw);
//      its share of dx, P_t = L[:, own] · w_own, into a per-thread [c, H] partial.
//      Thread 0 records each row's loss lse − target logit (lse = M + log S).
//   -- barrier --
//   3. rows split over threads: dx_c = Σ_t P_t in thread order (deterministic).
// The forward-only variant runs step 1, a barrier, the losses, and a barrier.
class VocabSplit {
 public:
  VocabSplit(const Dims& d, int threads) : d_(d), nt_(threads) {
    const std::size_t nc = static_cast<std::size_t>(d.chunk) * static_cast<std::size_t>(nt_);
    m_.resize(nc);
    s_.resize(nc);
    target_logit_.resize(static_cast<std::size_t>(d.chunk));
  }
  std::int64_t v0(int t) const { return d_.V * t / nt_; }
  std::int64_t v1(int t) const { return d_.V * (t + 1) / nt_; }

  // Step 1 for thread t over rows [0, c) of the chunk starting at row r0.
  void logits_and_partials(int t, float* L, const float* x, const float* w, const std::int32_t* tc, std::int64_t c) {
    const std::int64_t a = v0(t), b = v1(t), V = d_.V, H = d_.H;
    gemm(false, true, c, b - a, H, 1.0f, x, H, w + a * H, H, 0.0f, L + a, V);
    for (std::int64_t i = 0; i < c; ++i) {
      float* row = L + i * V + a;
      const std::size_t k = idx(t, i);
      if (tc[i] == kIgnoreIndex || b == a) {
        m_[k] = -INFINITY;
        s_[k] = 0.0f;
        continue;
      }
      if (tc[i] >= a && tc[i] < b) target_logit_[static_cast<std::size_t>(i)] = row[tc[i] - a];
      const float m = vec::max_of(row, b - a);
      m_[k] = m;
      s_[k] = vec::exp_shift_sum(row, row, b - a, m);
    }
  }

  // lse of row i from the threads' partials (the same order in every thread).
  float lse(std::int64_t i, float* big_m, float* big_s) const {
    float M = -INFINITY;
    for (int u = 0; u < nt_; ++u) M = std::max(M, m_[idx(u, i)]);
    float S = 0.0f;
    for (int u = 0; u < nt_; ++u) {
      const float mu = m_[idx(u, i)];
      if (mu != -INFINITY) S += s_[idx(u, i)] * vec::exp1(mu - M);
    }
    *big_m = M;
    *big_s = S;
    return M + std::log(S);
  }

  // Thread 0 after step 1: the losses of the chunk's rows into row_loss[0, c).
  void losses(const std::int32_t* tc, std::int64_t c, double* row_loss) const {
    for (std::int64_t i = 0; i < c; ++i) {
      if (tc[i] == kIgnoreIndex) continue;
      float M, S;
      row_loss[i] = static_cast<double>(lse(i, &M, &S)) - target_logit_[static_cast<std::size_t>(i)];
    }
  }

  // Step 2 for thread t: gradient of its columns in place, its dw rows, its dx partial P (c × H).
  void gradients(int t, float* L, const float* x, const float* w, float* dw, const std::int32_t* tc, std::int64_t c,
                 float scale, float* P) const {
    const std::int64_t a = v0(t), b = v1(t), V = d_.V, H = d_.H;
    for (std::int64_t i = 0; i < c; ++i) {
      float* row = L + i * V + a;
      if (tc[i] == kIgnoreIndex) {
        std::fill(row, row + (b - a), 0.0f);
        continue;
      }
      float M, S;
      lse(i, &M, &S);
      const float mt = m_[idx(t, i)];
      const float k = mt == -INFINITY ? 0.0f : scale * vec::exp1(mt - M) / S;
      for (std::int64_t j = 0; j < b - a; ++j) row[j] *= k;
      if (tc[i] >= a && tc[i] < b) row[tc[i] - a] -= scale;
    }
    if (b == a) {
      std::fill(P, P + c * H, 0.0f);
      return;
    }
    if (dw) gemm(true, false, b - a, H, c, 1.0f, L + a, V, x, H, 1.0f, dw + a * H, H);  // null: a frozen head
    gemm(false, false, c, H, b - a, 1.0f, L + a, V, w + a * H, H, 0.0f, P, H);
  }

 private:
  std::size_t idx(int t, std::int64_t i) const {
    return static_cast<std::size_t>(t) * static_cast<std::size_t>(d_.chunk) + static_cast<std::size_t>(i);
  }
  Dims d_;
  int nt_;
  std::vector<float> m_, s_, target_logit_;
};

// Low-precision tensors (bf16/fp16 input, weight or gradients): the same chunked algorithm in
// its plain form. Per chunk: the input rows widened into an fp32 [chunk, H] buffer, the logits
// L = x_c · wᵀ (gemm_ex converts w panel by panel), the loss and (softmax − onehot)·scale in
// place row by row, dx_c = L · w and dw += Lᵀ · x_c (gemm_ex rounds into the stored dtypes).
// Allocations, in order: the [chunk, V] logits, the [chunk, H] input rows, then each GEMM's
// transient panels (fused_linear_cross_entropy_workspace_blocks lists them for the plan).
LossSum lowp_chunks(CpuBackend& be, Tensor* dx, Tensor* dw, const Tensor& x, const Tensor& w, const Tensor& targets,
                    float scale, const Dims& d, ExecContext& ctx) {
  const std::int64_t T = d.T, H = d.H, V = d.V;
  Tensor L = Tensor::empty({d.chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  Tensor xc = Tensor::empty({d.chunk, H}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  const std::int32_t* tg = targets.data<std::int32_t>();
  std::vector<double> row_loss(static_cast<std::size_t>(T), 0.0);
  for (std::int64_t r0 = 0; r0 < T; r0 += d.chunk) {
    const std::int64_t c = std::min(d.chunk, T - r0);
    const std::int32_t* tc = tg + r0;
    convert(elem(x.raw(), x.dtype(), r0 * H), x.dtype(), xc.raw(), DType::kF32, static_cast<std::size_t>(c * H));
    be.gemm_ex(false, true, c, V, H, 1.0f, xc.raw(), DType::kF32, H, w.raw(), w.dtype(), H, 0.0f, L.raw(),
               DType::kF32, V, ctx);
    float* lp = L.f32();
    parallel_for(c, row_grain(V), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        float* row = lp + i * V;
        if (tc[i] == kIgnoreIndex) {
          if (dx) std::fill(row, row + V, 0.0f);
          continue;
        }
        const float m = vec::max_of(row, V);
        const float target = row[tc[i]];
        const float lse = m + std::log(vec::exp_shift_sum(row, V, m));
        row_loss[static_cast<std::size_t>(r0 + i)] = static_cast<double>(lse) - target;
        if (!dx) continue;
        vec::exp_shift_sum(row, row, V, lse);
        for (std::int64_t j = 0; j < V; ++j) row[j] *= scale;
        row[tc[i]] -= scale;
      }
    });
    if (!dx) continue;
    be.gemm_ex(false, false, c, H, V, 1.0f, L.raw(), DType::kF32, V, w.raw(), w.dtype(), H, 0.0f,
               elem(dx->raw(), dx->dtype(), r0 * H), dx->dtype(), H, ctx);
    if (dw->defined()) {  // undefined: a frozen head
      be.gemm_ex(true, false, V, H, c, 1.0f, L.raw(), DType::kF32, V, xc.raw(), DType::kF32, H, 1.0f, dw->raw(),
                 dw->dtype(), H, ctx);
    }
  }
  LossSum out;
  for (std::int64_t r = 0; r < T; ++r) {
    if (tg[r] == kIgnoreIndex) continue;
    out.sum += row_loss[static_cast<std::size_t>(r)];
    ++out.count;
  }
  return out;
}

}  // namespace

LossSum CpuBackend::fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w,
                                               const Tensor& targets, float grad_scale_per_token,
                                               std::int64_t chunk_tokens, ExecContext& ctx) {
  const Dims d = dims(x, w, targets, chunk_tokens, "fused_linear_cross_entropy");
  const std::int64_t T = d.T, H = d.H, V = d.V;
  LossSum out;
  if (T == 0) return out;
  if (x.dtype() != DType::kF32 || w.dtype() != DType::kF32 || dx.dtype() != DType::kF32 ||
      (dw.defined() && dw.dtype() != DType::kF32)) {
    return lowp_chunks(*this, &dx, &dw, x, w, targets, grad_scale_per_token, d, ctx);
  }
  Tensor scratch = Tensor::empty({d.chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  float* L = scratch.f32();
  const float* xp = x.f32();
  const float* wp = w.f32();
  const std::int32_t* tg = targets.data<std::int32_t>();
  float* dxp = dx.f32();
  float* dwp = dw.defined() ? dw.f32() : nullptr;  // null: a frozen head, no weight gradient
  const int nt = std::max(1, num_threads());
  VocabSplit split(d, nt);
  // Per-thread dx partials: host scratch like the other kernels' per-thread reductions (a
  // [chunk, H] block per thread, small next to the chunk's logits).
  std::vector<float> partial(static_cast<std::size_t>(nt) * static_cast<std::size_t>(d.chunk * H));
  std::vector<double> row_loss(static_cast<std::size_t>(T), 0.0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int k = omp_get_num_threads();  // may be fewer than asked; then the team does it all
    for (std::int64_t r0 = 0; r0 < T; r0 += d.chunk) {
      const std::int64_t c = std::min(d.chunk, T - r0);
      const std::int32_t* tc = tg + r0;
      bool any = false;
      for (std::int64_t i = 0; i < c && !any; ++i) any = tc[i] != kIgnoreIndex;
      if (!any) {  // every row ignored: zero input gradient, nothing for dw (same decision in every thread)
        std::fill(dxp + (r0 + c * t / k) * H, dxp + (r0 + c * (t + 1) / k) * H, 0.0f);
        continue;
      }
      for (int u = t; u < nt; u += k) split.logits_and_partials(u, L, xp + r0 * H, wp, tc, c);
#pragma omp barrier
      if (t == 0) split.losses(tc, c, row_loss.data() + r0);
      for (int u = t; u < nt; u += k)
        split.gradients(u, L, xp + r0 * H, wp, dwp, tc, c, grad_scale_per_token,
                        partial.data() + static_cast<std::size_t>(u) * static_cast<std::size_t>(d.chunk * H));
#pragma omp barrier
      const std::int64_t i0 = c * t / k, i1 = c * (t + 1) / k;
      for (std::int64_t i = i0; i < i1; ++i) {
        float* dr = dxp + (r0 + i) * H;
        const float* p0 = partial.data() + static_cast<std::size_t>(i * H);
        std::copy(p0, p0 + H, dr);
        for (int u = 1; u < nt; ++u) {
          const float* pu = partial.data() + static_cast<std::size_t>(u) * static_cast<std::size_t>(d.chunk * H) +
                            static_cast<std::size_t>(i * H);
          for (std::int64_t j = 0; j < H; ++j) dr[j] += pu[j];
        }
      }
      // The next chunk's step 1 rewrites L and the partials' inputs only; P is rewritten in its
      // step 2, after the next barrier, when every thread is done reading it here.
    }
  }
  for (std::int64_t r = 0; r < T; ++r) {
    if (tg[r] == kIgnoreIndex) continue;
    out.sum += row_loss[static_cast<std::size_t>(r)];
    ++out.count;
  }
  return out;
}

// Forward only needs no gradient, so it can loop the other way round: the vocabulary outside, a
// block of many tokens inside, with an online log-sum-exp per token (running max m and Σ exp(z − m)
// rescaled when the max grows). Each slice of w is then packed for BLAS once per token block instead
// of once per chunk. The scratch is the same chunk × V floats as the training kernel's, cut into
// one [tokens, vocab tile] block per thread; threads own vocabulary ranges as above.
LossSum CpuBackend::fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                                       std::int64_t chunk_tokens, ExecContext& ctx) {
  const Dims d = dims(x, w, targets, chunk_tokens, "fused_linear_cross_entropy_forward");
  const std::int64_t T = d.T, H = d.H, V = d.V;
  LossSum out;
  if (T == 0) return out;
  if (x.dtype() != DType::kF32 || w.dtype() != DType::kF32) {
    return lowp_chunks(*this, nullptr, nullptr, x, w, targets, 0, d, ctx);
  }
  Tensor scratch = Tensor::empty({d.chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  const int nt = static_cast<int>(std::clamp<std::int64_t>(num_threads(), 1, V));  // each owns >= 1 column
  // Token block and vocabulary tile: the block as large as the scratch allows with tiles of at
  // least kMinTile columns per thread (narrower tiles make poor GEMMs), at most all tokens.
  constexpr std::int64_t kMinTile = 256;
  const std::int64_t floats = d.chunk * V, per_thread_v = (V + nt - 1) / nt;
  const std::int64_t tb = std::max<std::int64_t>(
      1, std::min(T, floats / (static_cast<std::int64_t>(nt) * std::min(kMinTile, per_thread_v))));
  const std::int64_t vt = std::max<std::int64_t>(1, std::min(per_thread_v, floats / (nt * tb)));
  float* buf = scratch.f32();
  const float* xp = x.f32();
  const float* wp = w.f32();
  const std::int32_t* tg = targets.data<std::int32_t>();
  std::vector<float> m(static_cast<std::size_t>(nt * tb)), s(static_cast<std::size_t>(nt * tb));
  std::vector<float> target_logit(static_cast<std::size_t>(tb));
  std::vector<double> row_loss(static_cast<std::size_t>(T), 0.0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int k = omp_get_num_threads();
    for (std::int64_t r0 = 0; r0 < T; r0 += tb) {
      const std::int64_t c = std::min(tb, T - r0);
      const std::int32_t* tc = tg + r0;
      for (int u = t; u < nt; u += k) {
        float* mu = m.data() + static_cast<std::size_t>(u) * tb;
        float* su = s.data() + static_cast<std::size_t>(u) * tb;
        std::fill(mu, mu + c, -INFINITY);
        std::fill(su, su + c, 0.0f);
        float* tile = buf + static_cast<std::int64_t>(u) * tb * vt;
        for (std::int64_t a = V * u / nt, b = V * (u + 1) / nt; a < b; a += vt) {
          const std::int64_t n = std::min(vt, b - a);
          gemm(false, true, c, n, H, 1.0f, xp + r0 * H, H, wp + a * H, H, 0.0f, tile, n);
          for (std::int64_t i = 0; i < c; ++i) {
            if (tc[i] == kIgnoreIndex) continue;
            const float* row = tile + i * n;
            if (tc[i] >= a && tc[i] < a + n) target_logit[static_cast<std::size_t>(i)] = row[tc[i] - a];
            const float mt = vec::max_of(row, n);
            if (mt > mu[i]) {
              su[i] *= vec::exp1(mu[i] - mt);
              mu[i] = mt;
            }
            su[i] += vec::exp_shift_sum(row, n, mu[i]);
          }
        }
      }
#pragma omp barrier
      if (t == 0) {
        for (std::int64_t i = 0; i < c; ++i) {
          if (tc[i] == kIgnoreIndex) continue;
          float M = -INFINITY, S = 0.0f;
          for (int u = 0; u < nt; ++u) M = std::max(M, m[static_cast<std::size_t>(u * tb + i)]);
          for (int u = 0; u < nt; ++u) {
            const float mu = m[static_cast<std::size_t>(u * tb + i)];
            if (mu != -INFINITY) S += s[static_cast<std::size_t>(u * tb + i)] * vec::exp1(mu - M);
          }
          row_loss[static_cast<std::size_t>(r0 + i)] =
              static_cast<double>(M + std::log(S)) - target_logit[static_cast<std::size_t>(i)];
        }
      }
#pragma omp barrier
    }
  }
  for (std::int64_t r = 0; r < T; ++r) {
    if (tg[r] == kIgnoreIndex) continue;
    out.sum += row_loss[static_cast<std::size_t>(r)];
    ++out.count;
  }
  return out;
}

}  // namespace scalelab::kernels::cpu
