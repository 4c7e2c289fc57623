#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernel_common.h"
#include "kernels/matmul.h"

namespace scalelab::kernels {

namespace {

// Rows are processed in blocks; a block of query rows only needs the keys up to its last row
// (causality), which halves the GEMM work against a full S×S product.
constexpr std::int64_t kRowBlock = 64;

void check_shapes(const Tensor& qkv, const Tensor& out, const Tensor& probs, const AttentionShape& s, const char* op) {
  require_cpu(qkv, op);
  require_dtype(qkv, DType::kF32, op, "qkv");
  SCALELAB_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
                 std::string("[") + op + "] n_kv_heads must divide n_heads");
  require_numel(qkv, s.batch * s.seq * s.qkv_width(), op, "qkv");
  require_numel(out, s.batch * s.seq * s.out_width(), op, "output");
  require_numel(probs, s.batch * s.n_heads * s.seq * s.seq, op, "probs");
}

}  // namespace

std::size_t attention_eager_workspace_bytes(const AttentionShape& s, int threads) {
  return static_cast<std::size_t>(threads) * static_cast<std::size_t>(std::min(kRowBlock, s.seq) * s.seq) * sizeof(float);
}

void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                             ExecContext& ctx) {
  ProfileScope prof(ctx, "attention", Phase::kForward);
  check_shapes(qkv, out, probs, s, "attention_eager_forward");
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), ldo = s.out_width();
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  const std::int64_t q_off = 0, k_off = s.n_heads * hd, v_off = k_off + s.n_kv_heads * hd;
  const float* qp = qkv.f32();
  float* op = out.f32();
  float* pp = probs.f32();
  const std::int64_t tasks = s.batch * s.n_heads;
#pragma omp parallel for schedule(static)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / s.n_heads, h = task % s.n_heads, g = h / group;
    const float* Q = qp + b * S * ld + q_off + h * hd;
    const float* K = qp + b * S * ld + k_off + g * hd;
    const float* V = qp + b * S * ld + v_off + g * hd;
    float* P = pp + task * S * S;
    float* O = op + b * S * ldo + h * hd;
    for (std::int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
      const std::int64_t rows = std::min(kRowBlock, S - r0), cols = r0 + rows;
      float* Pb = P + r0 * S;
      gemm(false, true, rows, cols, hd, scale, Q + r0 * ld, ld, K, ld, 0.0f, Pb, S);
      for (std::int64_t i = 0; i < rows; ++i) {
        float* row = Pb + i * S;
        const std::int64_t valid = r0 + i + 1;  // keys 0..r0+i
        const float m = vec::max_of(row, valid);
        const float sum = vec::exp_shift_sum(row, row, valid, m);
        const float inv = 1.0f / sum;
        for (std::int64_t j = 0; j < valid; ++j) row[j] *= inv;
        std::memset(row + valid, 0, sizeof(float) * static_cast<std::size_t>(S - valid));
      }
      gemm(false, false, rows, hd, cols, 1.0f, Pb, S, V, ld, 0.0f, O + r0 * ldo, ldo);
    }
  }
}

void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                              const AttentionShape& s, float scale, ExecContext& ctx) {
  ProfileScope prof(ctx, "attention", Phase::kBackward);
  check_shapes(qkv, dout, probs, s, "attention_eager_backward");
  require_numel(dqkv, qkv.numel(), "attention_eager_backward", "qkv gradient");
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), ldo = s.out_width();
  const std::int64_t group = s.n_heads / s.n_kv_heads;
  const std::int64_t k_off = s.n_heads * hd, v_off = k_off + s.n_kv_heads * hd;
  const float* qp = qkv.f32();
  const float* pp = probs.f32();
  const float* gop = dout.f32();
  float* gp = dqkv.f32();
  const int nt = num_threads();
  const std::int64_t block = std::min(kRowBlock, S);
  Tensor scratch = Tensor::empty({static_cast<std::int64_t>(nt), block * S}, DType::kF32, *ctx.alloc,
                                 "attention workspace");
  float* scratch_p = scratch.f32();
  // One task per (batch, kv head): the query heads of a group all add into the same dK/dV, so
  // they run in order inside one task and no two threads write the same gradient.
  const std::int64_t tasks = s.batch * s.n_kv_heads;
#pragma omp parallel for schedule(static)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / s.n_kv_heads, g = task % s.n_kv_heads;
    float* dP = scratch_p + static_cast<std::int64_t>(omp_get_thread_num()) * block * S;
    const float* K = qp + b * S * ld + k_off + g * hd;
    const float* V = qp + b * S * ld + v_off + g * hd;
    float* dK = gp + b * S * ld + k_off + g * hd;
    float* dV = gp + b * S * ld + v_off + g * hd;
    for (std::int64_t t = 0; t < S; ++t) {
      std::memset(dK + t * ld, 0, sizeof(float) * static_cast<std::size_t>(hd));
      std::memset(dV + t * ld, 0, sizeof(float) * static_cast<std::size_t>(hd));
    }
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* Q = qp + b * S * ld + h * hd;
      float* dQ = gp + b * S * ld + h * hd;
      const float* P = pp + (b * s.n_heads + h) * S * S;
      const float* dO = gop + b * S * ldo + h * hd;
      for (std::int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
        const std::int64_t rows = std::min(kRowBlock, S - r0), cols = r0 + rows;
        const float* Pb = P + r0 * S;
        // dP = dO · V^T over the causal columns.
        gemm(false, true, rows, cols, hd, 1.0f, dO + r0 * ldo, ldo, V, ld, 0.0f, dP, S);
        // dS = P ⊙ (dP − Σ_j P·dP), in place in dP.
        for (std::int64_t i = 0; i < rows; ++i) {
          const float* pr = Pb + i * S;
          float* dr = dP + i * S;
          float dot = 0.0f;
          for (std::int64_t j = 0; j < cols; ++j) dot += pr[j] * dr[j];
          for (std::int64_t j = 0; j < cols; ++j) dr[j] = pr[j] * (dr[j] - dot);
        }
        // dQ = scale · dS K ; dK += scale · dS^T Q ; dV += P^T dO.
        gemm(false, false, rows, hd, cols, scale, dP, S, K, ld, 0.0f, dQ + r0 * ld, ld);
        gemm(true, false, cols, hd, rows, scale, dP, S, Q + r0 * ld, ld, 1.0f, dK, ld);
        gemm(true, false, cols, hd, rows, 1.0f, Pb, S, dO + r0 * ldo, ldo, 1.0f, dV, ld);
      }
    }
  }
}

}  // namespace scalelab::kernels
