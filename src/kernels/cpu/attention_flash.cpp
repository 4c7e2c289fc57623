// Flash attention on the CPU: tiled causal GQA attention with an online softmax (see
// kernels/attention.h for the contract). Tile products go through BLAS (gemm), one thread per
// task; the per-row softmax work uses the AVX2 exp of vec_math.h.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/matmul.h"

namespace scalelab::kernels {

namespace {

// A tile stacks the query heads of one kv group: Br positions × G heads = M rows (head-major:
// row k is head k / rows of the group at position r0 + k % rows). K/V tiles are then packed by
// BLAS once per group instead of once per head, and the GEMMs see M = G·Br rows even when Br is
// small enough to keep the causal diagonal's wasted work low.
struct Tiles {
  std::int64_t br, bc, m;     // positions per row tile, keys per column tile, stacked rows G·br
  std::int64_t fwd_floats;    // per-thread scratch of the forward, padded to a cache line
  std::int64_t bwd_floats;    // per-thread scratch of the backward, padded to a cache line
};

constexpr std::int64_t pad16(std::int64_t n) { return (n + 15) / 16 * 16; }

Tiles tiles_for(const AttentionShape& s) {
  Tiles t{};
  const std::int64_t group = s.n_kv_heads > 0 ? std::max<std::int64_t>(1, s.n_heads / s.n_kv_heads) : 1;
  t.br = std::max<std::int64_t>(1, std::min(std::max<std::int64_t>(1, kFlashRowTile / group), s.seq));
  t.bc = std::max<std::int64_t>(1, std::min(kFlashColTile, s.seq));
  t.m = group * t.br;
  t.fwd_floats = pad16(t.m * t.bc + 2 * t.m * s.head_dim + 2 * t.m);
  t.bwd_floats = pad16(2 * t.m * t.bc + 3 * t.m * s.head_dim + 2 * t.m);
  return t;
}

// Extra per-thread floats for low-precision tensors: K and V of one (batch, kv head) staged in
// fp32 (forward and backward), and fp32 dK/dV accumulators (backward, low-precision dqkv).
std::int64_t stage_floats(const AttentionShape& s, Phase phase, DType act) {
  if (act == DType::kF32) return 0;
  const std::int64_t kv = 2 * s.seq * s.head_dim;
  return pad16(phase == Phase::kForward ? kv : 2 * kv);
}

// Number of columns of a tile starting at key c0 that query row `row` may see (causal), in [0, cols].
inline std::int64_t visible(std::int64_t row, std::int64_t c0, std::int64_t cols) {
  return std::clamp<std::int64_t>(row - c0 + 1, 0, cols);
}

// y[i] = exp(x[i] - shift) for i < n (in place allowed).
inline void exp_shift(const float* x, float* y, std::int64_t n, float shift) {
  std::int64_t i = 0;
#ifdef SCALELAB_AVX2
  const __m256 sh = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, vec::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)));
#endif
  for (; i < n; ++i) y[i] = vec::exp1(x[i] - shift);
}

inline float dot(const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  s = vec::hsum8(acc);
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// ds[i] = p[i] * (ds[i] - d) for i < n: turns dP into dS in place.
inline void softmax_grad(const float* p, float* ds, std::int64_t n, float d) {
  std::int64_t i = 0;
#ifdef SCALELAB_AVX2
  const __m256 dv = _mm256_set1_ps(d);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(ds + i, _mm256_mul_ps(_mm256_loadu_ps(p + i), _mm256_sub_ps(_mm256_loadu_ps(ds + i), dv)));
#endif
  for (; i < n; ++i) ds[i] = p[i] * (ds[i] - d);
}

inline void scale_row(float* x, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= a;
}

}  // namespace

std::size_t attention_flash_workspace_bytes(const AttentionShape& s, int threads, Phase phase, DType act) {
  SCALELAB_CHECK(phase == Phase::kForward || phase == Phase::kBackward,
                 "[attention_flash_workspace_bytes] phase must be forward or backward");
  const Tiles t = tiles_for(s);
  const std::int64_t per_thread = (phase == Phase::kForward ? t.fwd_floats : t.bwd_floats) + stage_floats(s, phase, act);
  return static_cast<std::size_t>(std::max(1, threads)) * static_cast<std::size_t>(per_thread) * sizeof(float);
}

namespace cpu {

void CpuBackend::attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s,
                                         float scale, ExecContext& ctx) {
  const Tiles tl = tiles_for(s);
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), ldo = s.out_width();
  const std::int64_t G = s.n_heads / s.n_kv_heads;
  const std::int64_t k_off = s.n_heads * hd, v_off = k_off + s.n_kv_heads * hd;
  const std::int64_t Br = tl.br, Bc = tl.bc;
  const DType dt = qkv.dtype();
  const std::int64_t per_thread = tl.fwd_floats + stage_floats(s, Phase::kForward, dt);
  float* lp = lse.f32();
  const int nt = num_threads();
  Tensor scratch = Tensor::empty({static_cast<std::int64_t>(nt) * per_thread}, DType::kF32, *ctx.alloc,
                                 "attention workspace");
  float* scratch_p = scratch.f32();
  // A task per (batch, kv head, row tile): each writes its own rows of out and lse. Row tiles cost
  // in proportion to their index (causality); dealing them round-robin balances the threads.
  const std::int64_t row_tiles = (S + Br - 1) / Br;
  const std::int64_t tasks = s.batch * s.n_kv_heads * row_tiles;
#pragma omp parallel for schedule(static, 1)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t rt = task % row_tiles, bg = task / row_tiles;
    const std::int64_t b = bg / s.n_kv_heads, g = bg % s.n_kv_heads;
    const std::int64_t r0 = rt * Br, rows = std::min(Br, S - r0), end = r0 + rows;  // keys [0, end) visible
    const std::int64_t M = G * rows;
    float* tile = scratch_p + static_cast<std::int64_t>(omp_get_thread_num()) * per_thread;
    float* Qs = tile + tl.m * Bc;  // stacked queries [M, hd]
    float* Os = Qs + tl.m * hd;    // stacked output accumulator [M, hd]
    float* m = Os + tl.m * hd;     // running row max
    float* l = m + tl.m;           // running row sum of exp(score − m)
    const void* base = elem(qkv.raw(), dt, b * S * ld);
    // K and V of this kv head: read in place when fp32, else the visible keys staged in fp32.
    const float* K;
    const float* V;
    std::int64_t ldk = ld;
    if (dt == DType::kF32) {
      K = static_cast<const float*>(base) + k_off + g * hd;
      V = static_cast<const float*>(base) + v_off + g * hd;
    } else {
      float* Ks = tile + tl.fwd_floats;
      float* Vs = Ks + S * hd;
      for (std::int64_t t = 0; t < end; ++t) {
        convert(elem(base, dt, t * ld + k_off + g * hd), dt, Ks + t * hd, DType::kF32, static_cast<std::size_t>(hd));
        convert(elem(base, dt, t * ld + v_off + g * hd), dt, Vs + t * hd, DType::kF32, static_cast<std::size_t>(hd));
      }
      K = Ks;
      V = Vs;
      ldk = hd;
    }
    for (std::int64_t k = 0; k < M; ++k)
      convert(elem(base, dt, (r0 + k % rows) * ld + (g * G + k / rows) * hd), dt, Qs + k * hd, DType::kF32,
              static_cast<std::size_t>(hd));
    for (std::int64_t c0 = 0; c0 < end; c0 += Bc) {
      const std::int64_t cols = std::min(Bc, end - c0);
      gemm(false, true, M, cols, hd, scale, Qs, hd, K + c0 * ldk, ldk, 0.0f, tile, Bc);
      for (std::int64_t k = 0; k < M; ++k) {
        float* row = tile + k * Bc;
        const std::int64_t n = visible(r0 + k % rows, c0, cols);
        if (n == 0) {  // the row's keys all lie in earlier tiles
          std::memset(row, 0, sizeof(float) * static_cast<std::size_t>(cols));
          continue;
        }
        if (c0 == 0) {  // first tile: every row sees key 0, so the running state starts here
          m[k] = vec::max_of(row, n);
          l[k] = vec::exp_shift_sum(row, row, n, m[k]);
        } else {
          const float m_new = std::max(m[k], vec::max_of(row, n));
          const float alpha = vec::exp1(m[k] - m_new);
          l[k] = l[k] * alpha + vec::exp_shift_sum(row, row, n, m_new);
          m[k] = m_new;
          if (alpha != 1.0f) scale_row(Os + k * hd, hd, alpha);
        }
        if (n < cols) std::memset(row + n, 0, sizeof(float) * static_cast<std::size_t>(cols - n));
      }
      gemm(false, false, M, hd, cols, 1.0f, tile, Bc, V + c0 * ldk, ldk, c0 == 0 ? 0.0f : 1.0f, Os, hd);
    }
    for (std::int64_t k = 0; k < M; ++k) {
      const std::int64_t i = k % rows, h = g * G + k / rows;
      const float inv = 1.0f / l[k];
      float* src = Os + k * hd;
      for (std::int64_t d = 0; d < hd; ++d) src[d] *= inv;
      convert(src, DType::kF32, elem(out.raw(), dt, (b * S + r0 + i) * ldo + h * hd), dt, static_cast<std::size_t>(hd));
      lp[(b * s.n_heads + h) * S + r0 + i] = m[k] + std::log(l[k]);
    }
  }
}

void CpuBackend::attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                          const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) {
  const Tiles tl = tiles_for(s);
  const std::int64_t S = s.seq, hd = s.head_dim, ld = s.qkv_width(), ldo = s.out_width();
  const std::int64_t G = s.n_heads / s.n_kv_heads;
  const std::int64_t k_off = s.n_heads * hd, v_off = k_off + s.n_kv_heads * hd;
  const std::int64_t Br = tl.br, Bc = tl.bc;
  const DType dt = qkv.dtype();
  const std::int64_t per_thread = tl.bwd_floats + stage_floats(s, Phase::kBackward, dt);
  const float* lp = lse.f32();
  const int nt = num_threads();
  Tensor scratch = Tensor::empty({static_cast<std::int64_t>(nt) * per_thread}, DType::kF32, *ctx.alloc,
                                 "attention workspace");
  float* scratch_p = scratch.f32();
  // One task per (batch, kv head): the query heads of a group all add into the same dK/dV, so
  // they run in a fixed order inside one task and no two threads write the same gradient.
  const std::int64_t tasks = s.batch * s.n_kv_heads;
#pragma omp parallel for schedule(static)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / s.n_kv_heads, g = task % s.n_kv_heads;
    float* P = scratch_p + static_cast<std::int64_t>(omp_get_thread_num()) * per_thread;
    float* dS = P + tl.m * Bc;
    float* Qs = dS + tl.m * Bc;   // stacked queries [M, hd]
    float* dOs = Qs + tl.m * hd;  // stacked output gradients [M, hd]
    float* dQs = dOs + tl.m * hd; // stacked query gradients [M, hd]
    float* D = dQs + tl.m * hd;   // rowsum(dO ⊙ O)
    float* L = D + tl.m;          // saved log-sum-exp
    const void* base = elem(qkv.raw(), dt, b * S * ld);
    void* dbase = elem(dqkv.raw(), dt, b * S * ld);
    // K, V read in place and dK, dV accumulated in place when fp32; else staged in fp32.
    const float* K;
    const float* V;
    float* dK;
    float* dV;
    std::int64_t ldk = ld;
    if (dt == DType::kF32) {
      K = static_cast<const float*>(base) + k_off + g * hd;
      V = static_cast<const float*>(base) + v_off + g * hd;
      dK = static_cast<float*>(dbase) + k_off + g * hd;
      dV = static_cast<float*>(dbase) + v_off + g * hd;
    } else {
      float* Ks = P + tl.bwd_floats;
      float* Vs = Ks + S * hd;
      dK = Vs + S * hd;
      dV = dK + S * hd;
      for (std::int64_t t = 0; t < S; ++t) {
        convert(elem(base, dt, t * ld + k_off + g * hd), dt, Ks + t * hd, DType::kF32, static_cast<std::size_t>(hd));
        convert(elem(base, dt, t * ld + v_off + g * hd), dt, Vs + t * hd, DType::kF32, static_cast<std::size_t>(hd));
      }
      K = Ks;
      V = Vs;
      ldk = hd;
    }
    for (std::int64_t t = 0; t < S; ++t) {
      std::memset(dK + t * ldk, 0, sizeof(float) * static_cast<std::size_t>(hd));
      std::memset(dV + t * ldk, 0, sizeof(float) * static_cast<std::size_t>(hd));
    }
    for (std::int64_t r0 = 0; r0 < S; r0 += Br) {
      const std::int64_t rows = std::min(Br, S - r0), end = r0 + rows, M = G * rows;
      for (std::int64_t k = 0; k < M; ++k) {
        const std::int64_t t = b * S + r0 + k % rows, h = g * G + k / rows;
        convert(elem(qkv.raw(), dt, t * ld + h * hd), dt, Qs + k * hd, DType::kF32, static_cast<std::size_t>(hd));
        convert(elem(dout.raw(), dt, t * ldo + h * hd), dt, dOs + k * hd, DType::kF32, static_cast<std::size_t>(hd));
        const float* o = load_row(elem(out.raw(), dt, t * ldo + h * hd), dt, hd, 0);
        D[k] = dot(dOs + k * hd, o, hd);
        L[k] = lp[(b * s.n_heads + h) * S + r0 + k % rows];
      }
      for (std::int64_t c0 = 0; c0 < end; c0 += Bc) {
        const std::int64_t cols = std::min(Bc, end - c0);
        // P = exp(scale · Q K^T − lse), zero above the diagonal.
        gemm(false, true, M, cols, hd, scale, Qs, hd, K + c0 * ldk, ldk, 0.0f, P, Bc);
        for (std::int64_t k = 0; k < M; ++k) {
          float* row = P + k * Bc;
          const std::int64_t n = visible(r0 + k % rows, c0, cols);
          exp_shift(row, row, n, L[k]);
          if (n < cols) std::memset(row + n, 0, sizeof(float) * static_cast<std::size_t>(cols - n));
        }
        // dP = dO V^T, then dS = P ⊙ (dP − D) in place (zero wherever P is).
        gemm(false, true, M, cols, hd, 1.0f, dOs, hd, V + c0 * ldk, ldk, 0.0f, dS, Bc);
        for (std::int64_t k = 0; k < M; ++k) softmax_grad(P + k * Bc, dS + k * Bc, cols, D[k]);
        // dV += P^T dO and dK += scale · dS^T Q (summing the group's heads inside the GEMM);
        // dQ = (first tile), then += scale · dS K.
        gemm(true, false, cols, hd, M, 1.0f, P, Bc, dOs, hd, 1.0f, dV + c0 * ldk, ldk);
        gemm(true, false, cols, hd, M, scale, dS, Bc, Qs, hd, 1.0f, dK + c0 * ldk, ldk);
        gemm(false, false, M, hd, cols, scale, dS, Bc, K + c0 * ldk, ldk, c0 == 0 ? 0.0f : 1.0f, dQs, hd);
      }
      for (std::int64_t k = 0; k < M; ++k)
        convert(dQs + k * hd, DType::kF32, elem(dbase, dt, (r0 + k % rows) * ld + (g * G + k / rows) * hd), dt,
                static_cast<std::size_t>(hd));
    }
    if (dt != DType::kF32) {
      for (std::int64_t t = 0; t < S; ++t) {
        convert(dK + t * hd, DType::kF32, elem(dbase, dt, t * ld + k_off + g * hd), dt, static_cast<std::size_t>(hd));
        convert(dV + t * hd, DType::kF32, elem(dbase, dt, t * ld + v_off + g * hd), dt, static_cast<std::size_t>(hd));
      }
    }
  }
}

}  // namespace cpu
}  // namespace scalelab::kernels
