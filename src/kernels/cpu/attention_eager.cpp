// Eager attention on the CPU (attention.h): the probabilities materialized block by block.
#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/matmul.h"

namespace scalelab::kernels {

namespace {

// Rows are processed in blocks; a block of query rows only needs the keys up to its last row
// (causality), which halves the GEMM work against a full S×S product.
constexpr std::int64_t kRowBlock = 64;

// A read-only fp32 view of a [rows, cols] sub-matrix with leading dimension ld: the data itself
// when fp32, else a converted copy in `scratch` (leading dimension cols).
struct View {
  const float* p;
  std::int64_t ld;
};
View stage(const void* base, DType dt, std::int64_t rows, std::int64_t cols, std::int64_t ld, float* scratch) {
  if (dt == DType::kF32) return {static_cast<const float*>(base), ld};
  for (std::int64_t r = 0; r < rows; ++r)
    convert(elem(base, dt, r * ld), dt, scratch + r * cols, DType::kF32, static_cast<std::size_t>(cols));
  return {scratch, cols};
}
// Writes a [rows, cols] fp32 block (leading dimension cols) into base (dtype dt, leading dim ld).
void unstage(const float* src, void* base, DType dt, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  for (std::int64_t r = 0; r < rows; ++r)
    convert(src + r * cols, DType::kF32, elem(base, dt, r * ld), dt, static_cast<std::size_t>(cols));
}

struct FwdScratch {
  std::int64_t q, k, v, p, o, total;
};
FwdScratch fwd_scratch(const AttentionShape& s, DType qkv_t, DType probs_t, DType out_t) {
  const std::int64_t S = s.seq, hd = s.head_dim, blk = std::min(kRowBlock, S);
  FwdScratch f{};
  const std::int64_t x = qkv_t == DType::kF32 ? 0 : S * hd;
  f.q = 0;
  f.k = f.q + x;
  f.v = f.k + x;
  f.p = f.v + x;
  f.o = f.p + (probs_t == DType::kF32 ? 0 : blk * S);
  f.total = f.o + (out_t == DType::kF32 ? 0 : blk * hd);
  return f;
}

struct BwdScratch {
  std::int64_t k, v, q, dout, dk, dv, dq, p, dp, total;
};
BwdScratch bwd_scratch(const AttentionShape& s, DType qkv_t, DType dout_t, DType probs_t, DType dqkv_t) {
  const std::int64_t S = s.seq, hd = s.head_dim, blk = std::min(kRowBlock, S);
  BwdScratch b{};
  const std::int64_t x = qkv_t == DType::kF32 ? 0 : S * hd;
  const std::int64_t g = dqkv_t == DType::kF32 ? 0 : S * hd;
  b.k = 0;
  b.v = b.k + x;
  b.q = b.v + x;
  b.dout = b.q + x;
  b.dk = b.dout + (dout_t == DType::kF32 ? 0 : S * hd);
  b.dv = b.dk + g;
  b.dq = b.dv + g;
  b.p = b.dq + (dqkv_t == DType::kF32 ? 0 : blk * hd);
  b.dp = b.p + (probs_t == DType::kF32 ? 0 : blk * S);
  b.total = b.dp + blk * S;
  return b;
}

}  // namespace

std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads) {
  return attention_eager_workspace_bytes(s, threads, DType::kF32);
}

std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads, DType act) {
  const std::int64_t fwd = fwd_scratch(s, act, act, act).total;
  const std::int64_t bwd = bwd_scratch(s, act, act, act, act).total;
  return static_cast<std::size_t>(threads) * static_cast<std::size_t>(std::max(fwd, bwd)) * sizeof(float);
}

std::size_t attention_eager_forward_workspace_bytes(const AttentionShape& s, int threads, DType act) {
  return attention_eager_forward_workspace_bytes(s, threads, act, act, act);
}

std::size_t attention_eager_backward_workspace_bytes(const AttentionShape& s, int threads, DType act) {
  return attention_eager_backward_workspace_bytes(s, threads, act, act, act, act);
}

std::size_t attention_eager_forward_workspace_bytes(const AttentionShape& s, int threads, DType qkv, DType probs,
                                                    DType out) {
  return static_cast<std::size_t>(threads) * static_cast<std::size_t>(fwd_scratch(s, qkv, probs, out).total) *
         sizeof(float);
}

std::size_t attention_eager_backward_workspace_bytes(const AttentionShape& s, int threads, DType qkv, DType dout,
                                                     DType probs, DType dqkv) {
  return static_cast<std::size_t>(threads) * static_cast<std::size_t>(bwd_scratch(s, qkv, dout, probs, dqkv).total) *
         sizeof(float);
}

namespace cpu {

void CpuBackend::attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s,
                                         float scale, ExecContext& ctx) {
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), ldo = s.out_width();
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  const std::int64_t k_off = s.n_heads * hd, v_off = k_off + s.n_kv_heads * hd;
  const DType qt = qkv.dtype(), pt = probs.dtype(), ot = out.dtype();
  const FwdScratch fs = fwd_scratch(s, qt, pt, ot);
  const int nt = num_threads();
  Tensor scratch;
  if (fs.total > 0)
    scratch = Tensor::empty({static_cast<std::int64_t>(nt) * fs.total}, DType::kF32, *ctx.alloc, "attention workspace");
  const std::int64_t tasks = s.batch * s.n_heads;
#pragma omp parallel for schedule(static)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / s.n_heads, h = task % s.n_heads, g = h / group;
    float* ws = fs.total > 0 ? scratch.f32() + static_cast<std::int64_t>(omp_get_thread_num()) * fs.total : nullptr;
    const View Q = stage(elem(qkv.raw(), qt, b * S * ld + h * hd), qt, S, hd, ld, ws + fs.q);
    const View K = stage(elem(qkv.raw(), qt, b * S * ld + k_off + g * hd), qt, S, hd, ld, ws + fs.k);
    const View V = stage(elem(qkv.raw(), qt, b * S * ld + v_off + g * hd), qt, S, hd, ld, ws + fs.v);
    void* P = elem(probs.raw(), pt, task * S * S);
    void* O = elem(out.raw(), ot, b * S * ldo + h * hd);
    for (std::int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
      const std::int64_t rows = std::min(kRowBlock, S - r0), cols = r0 + rows;
      // Scores and probabilities of this row block, in fp32 (in place in probs when fp32).
      float* Pb = pt == DType::kF32 ? static_cast<float*>(P) + r0 * S : ws + fs.p;
      gemm(false, true, rows, cols, hd, scale, Q.p + r0 * Q.ld, Q.ld, K.p, K.ld, 0.0f, Pb, S);
      for (std::int64_t i = 0; i < rows; ++i) {
        float* row = Pb + i * S;
        const std::int64_t valid = r0 + i + 1;  // keys 0..r0+i
        const float m = vec::max_of(row, valid);
        const float sum = vec::exp_shift_sum(row, row, valid, m);
        const float inv = 1.0f / sum;
        for (std::int64_t j = 0; j < valid; ++j) row[j] *= inv;
        std::memset(row + valid, 0, sizeof(float) * static_cast<std::size_t>(S - valid));
      }
      if (pt != DType::kF32) {
        // Round the stored probabilities first and use the rounded values, as a low-precision
        // framework multiplies the probabilities it saved.
        unstage(Pb, elem(P, pt, r0 * S), pt, rows, S, S);
        for (std::int64_t i = 0; i < rows; ++i)
          convert(elem(P, pt, (r0 + i) * S), pt, Pb + i * S, DType::kF32, static_cast<std::size_t>(cols));
      }
      if (ot == DType::kF32) {
        gemm(false, false, rows, hd, cols, 1.0f, Pb, S, V.p, V.ld, 0.0f, static_cast<float*>(O) + r0 * ldo, ldo);
      } else {
        gemm(false, false, rows, hd, cols, 1.0f, Pb, S, V.p, V.ld, 0.0f, ws + fs.o, hd);
        unstage(ws + fs.o, elem(O, ot, r0 * ldo), ot, rows, hd, ldo);
      }
    }
  }
}

void CpuBackend::attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                          const AttentionShape& s, float scale, ExecContext& ctx) {
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), ldo = s.out_width();
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  const std::int64_t k_off = s.n_heads * hd, v_off = k_off + s.n_kv_heads * hd;
  const DType qt = qkv.dtype(), pt = probs.dtype(), gt = dout.dtype(), dt = dqkv.dtype();
  const BwdScratch bs = bwd_scratch(s, qt, gt, pt, dt);
  const int nt = num_threads();
  Tensor scratch = Tensor::empty({static_cast<std::int64_t>(nt) * bs.total}, DType::kF32, *ctx.alloc,
                                 "attention workspace");
  // One task per (batch, kv head): the query heads of a group all add into the same dK/dV, so
  // they run in order inside one task and no two threads write the same gradient.
  const std::int64_t tasks = s.batch * s.n_kv_heads;
#pragma omp parallel for schedule(static)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / s.n_kv_heads, g = task % s.n_kv_heads;
    float* ws = scratch.f32() + static_cast<std::int64_t>(omp_get_thread_num()) * bs.total;
    float* dP = ws + bs.dp;
    const View K = stage(elem(qkv.raw(), qt, b * S * ld + k_off + g * hd), qt, S, hd, ld, ws + bs.k);
    const View V = stage(elem(qkv.raw(), qt, b * S * ld + v_off + g * hd), qt, S, hd, ld, ws + bs.v);
    void* dK_out = elem(dqkv.raw(), dt, b * S * ld + k_off + g * hd);
    void* dV_out = elem(dqkv.raw(), dt, b * S * ld + v_off + g * hd);
    float* dK = dt == DType::kF32 ? static_cast<float*>(dK_out) : ws + bs.dk;
    float* dV = dt == DType::kF32 ? static_cast<float*>(dV_out) : ws + bs.dv;
    const std::int64_t ldk = dt == DType::kF32 ? ld : hd;
    for (std::int64_t t = 0; t < S; ++t) {
      std::memset(dK + t * ldk, 0, sizeof(float) * static_cast<std::size_t>(hd));
      std::memset(dV + t * ldk, 0, sizeof(float) * static_cast<std::size_t>(hd));
    }
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      const View Q = stage(elem(qkv.raw(), qt, b * S * ld + h * hd), qt, S, hd, ld, ws + bs.q);
      const View dO = stage(elem(dout.raw(), gt, b * S * ldo + h * hd), gt, S, hd, ldo, ws + bs.dout);
      void* dQ_out = elem(dqkv.raw(), dt, b * S * ld + h * hd);
      const void* P = elem(probs.raw(), pt, (b * s.n_heads + h) * S * S);
      for (std::int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
        const std::int64_t rows = std::min(kRowBlock, S - r0), cols = r0 + rows;
        const View Pb = stage(elem(P, pt, r0 * S), pt, rows, S, S, ws + bs.p);
        // dP = dO · V^T over the causal columns.
        gemm(false, true, rows, cols, hd, 1.0f, dO.p + r0 * dO.ld, dO.ld, V.p, V.ld, 0.0f, dP, S);
        // dS = P ⊙ (dP − Σ_j P·dP), in place in dP.
        for (std::int64_t i = 0; i < rows; ++i) {
          const float* pr = Pb.p + i * Pb.ld;
          float* dr = dP + i * S;
          float dot = 0.0f;
          for (std::int64_t j = 0; j < cols; ++j) dot += pr[j] * dr[j];
          for (std::int64_t j = 0; j < cols; ++j) dr[j] = pr[j] * (dr[j] - dot);
        }
        // dQ = scale · dS K ; dK += scale · dS^T Q ; dV += P^T dO.
        if (dt == DType::kF32) {
          gemm(false, false, rows, hd, cols, scale, dP, S, K.p, K.ld, 0.0f, static_cast<float*>(dQ_out) + r0 * ld, ld);
        } else {
          gemm(false, false, rows, hd, cols, scale, dP, S, K.p, K.ld, 0.0f, ws + bs.dq, hd);
          unstage(ws + bs.dq, elem(dQ_out, dt, r0 * ld), dt, rows, hd, ld);
        }
        gemm(true, false, cols, hd, rows, scale, dP, S, Q.p + r0 * Q.ld, Q.ld, 1.0f, dK, ldk);
        gemm(true, false, cols, hd, rows, 1.0f, Pb.p, Pb.ld, dO.p + r0 * dO.ld, dO.ld, 1.0f, dV, ldk);
      }
    }
    if (dt != DType::kF32) {
      unstage(dK, dK_out, dt, S, hd, ld);
      unstage(dV, dV_out, dt, S, hd, ld);
    }
  }
}

}  // namespace cpu
}  // namespace scalelab::kernels
