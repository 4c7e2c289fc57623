#include "kernels/cpu/skinny_gemm.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/small_k_gemm.h"
#include "kernels/cpu/vec_math.h"

namespace scalelab::kernels::cpu {

namespace {

// One output element from its sum: alpha·s, plus beta·c when beta ≠ 0 (c unread otherwise).
inline float finish(float s, float alpha, float beta, const float* c) {
  return beta == 0.0f ? alpha * s : std::fma(beta, *c, alpha * s);
}

// ---- no trans_a, n small: C[i, j] = Σ_q A[i, q]·Bt[j, q], Bt = op(B)ᵀ as rows of k ----------

// A block: 3 rows of A by 4 rows of Bt (columns of C): 12 accumulators, the 3 rows' vectors and
// one of Bt, 16 registers (2 × 4 measured 25-40 % slower at LoRA's shapes, 4 × 3 10-20 %).
constexpr int kDotRows = 3;
constexpr int kDotCols = 4;

#ifdef SCALELAB_AVX2
// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))
inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 u = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

inline __m256i tail_mask(std::int64_t left) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lanes);
}
#endif

// k is cut into chunks of kDotChunk (a multiple of 8, so each term keeps its lane): a block's
// rows of A stay in L1 while every column group of Bt passes over them. The lanes are kept in
// memory between chunks (stored and reloaded exactly), so the arithmetic is that of one pass.
constexpr std::int64_t kDotChunk = 512;

// lanes[r][c][0..8) += A row r · Bt row c over q in [q0, q1), lane q mod 8; when q1 == k the last
// k mod 8 terms go in their lanes and the other lanes add 0·0.
template <int R, int NC>
void dot_block(std::int64_t q0, std::int64_t q1, std::int64_t k, const float* a, std::int64_t lda, const float* bt,
               std::int64_t ldbt, float lanes[R][kDotCols][8]) {
#ifdef SCALELAB_AVX2
  __m256 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_loadu_ps(lanes[r][c]);
  std::int64_t q = q0;
  for (; q + 8 <= q1; q += 8) {
    __m256 av[R];
    for (int r = 0; r < R; ++r) av[r] = _mm256_loadu_ps(a + r * lda + q);
    for (int c = 0; c < NC; ++c) {
      const __m256 bv = _mm256_loadu_ps(bt + c * ldbt + q);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(av[r], bv, acc[r][c]);
    }
  }
  if (q1 == k && q < k) {
    const __m256i mask = tail_mask(k - q);
    __m256 bv[NC];
    for (int c = 0; c < NC; ++c) bv[c] = _mm256_maskload_ps(bt + c * ldbt + q, mask);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_maskload_ps(a + r * lda + q, mask);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_fmadd_ps(av, bv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(lanes[r][c], acc[r][c]);
#else
  // The same arithmetic lane by lane.
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NC; ++c) {
      float* p = lanes[r][c];
      for (std::int64_t q = q0; q < q1; ++q) p[q % 8] = std::fma(a[r * lda + q], bt[c * ldbt + q], p[q % 8]);
      if (q1 == k)
        for (std::int64_t q = k; q % 8 != 0; ++q) p[q % 8] = std::fma(0.0f, 0.0f, p[q % 8]);
    }
  }
#endif
}

// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)), as hsum8
inline float lane_sum(const float p[8]) {
#ifdef SCALELAB_AVX2
  return hsum8(_mm256_loadu_ps(p));
#else
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
#endif
}

template <int R>
void dot_rows(std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* bt,
              std::int64_t ldbt, float beta, float* c, std::int64_t ldc) {
  for (std::int64_t j = 0; j < n; j += kSkinny) {  // at most kSkinny columns: their lanes fit in 2 KiB
    const std::int64_t jn = std::min(kSkinny, n - j);
    float lanes[kSkinny / kDotCols][R][kDotCols][8] = {};
    for (std::int64_t q0 = 0; q0 < k; q0 += kDotChunk) {
      const std::int64_t q1 = std::min(k, q0 + kDotChunk);
      for (std::int64_t g = 0; g * kDotCols < jn; ++g) {
        const float* b = bt + (j + g * kDotCols) * ldbt;
        switch (std::min<std::int64_t>(kDotCols, jn - g * kDotCols)) {
          case 4: dot_block<R, 4>(q0, q1, k, a, lda, b, ldbt, lanes[g]); break;
          case 3: dot_block<R, 3>(q0, q1, k, a, lda, b, ldbt, lanes[g]); break;
          case 2: dot_block<R, 2>(q0, q1, k, a, lda, b, ldbt, lanes[g]); break;
          default: dot_block<R, 1>(q0, q1, k, a, lda, b, ldbt, lanes[g]); break;
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (std::int64_t cc = 0; cc < jn; ++cc) {
        float* cp = c + r * ldc + j + cc;
        *cp = finish(lane_sum(lanes[cc / kDotCols][r][cc % kDotCols]), alpha, beta, cp);
      }
  }
}

void small_n(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
             std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  // Bt = op(B)ᵀ [n, k]: B itself when transposed, else B [k, n] transposed (n·k floats, n <= kSkinny).
  const float* bt = trans_b ? b : transposed_scratch(b, k, n, ldb);
  const std::int64_t ldbt = trans_b ? ldb : k;
  const std::int64_t blocks = (m + kDotRows - 1) / kDotRows;
  parallel_for(blocks, row_grain(kDotRows * n * k), [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      const std::int64_t i0 = blk * kDotRows;
      if (m - i0 >= 3) {
        dot_rows<3>(n, k, alpha, a + i0 * lda, lda, bt, ldbt, beta, c + i0 * ldc, ldc);
      } else if (m - i0 == 2) {
        dot_rows<2>(n, k, alpha, a + i0 * lda, lda, bt, ldbt, beta, c + i0 * ldc, ldc);
      } else {
        dot_rows<1>(n, k, alpha, a + i0 * lda, lda, bt, ldbt, beta, c + i0 * ldc, ldc);
      }
    }
  });
}

// ---- trans_a: S[p, q] = Σ_t U[t, p]·V[t, q] over the k rows, p small -----------------------
// C = S (dA = dzᵀ·x: U = A, V = B) or C = Sᵀ (dB = dyᵀ·z: U = B, V = A).

constexpr int kOuterP = 4;    // columns of U per block (broadcast)
constexpr int kOuterQ = 16;   // columns of V per block (two vectors): 4 × 2 accumulators

// out[p][q] for P columns of U from column p0 and W <= 16 columns of V: each a fused
// multiply-add chain over t = 0..k-1 in order.
template <int P, int W>
void outer_block(std::int64_t k, const float* u, std::int64_t ldu, const float* v, std::int64_t ldv,
                 float out[kOuterP][kOuterQ]) {
#ifdef SCALELAB_AVX2
  if constexpr (W == 16 || W == 8) {
    constexpr int V8 = W / 8;
    __m256 acc[P][V8];
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < V8; ++h) acc[p][h] = _mm256_setzero_ps();
    for (std::int64_t t = 0; t < k; ++t) {
      const float* vt = v + t * ldv;
      __m256 vv[V8];
      for (int h = 0; h < V8; ++h) vv[h] = _mm256_loadu_ps(vt + 8 * h);
      const float* ut = u + t * ldu;
      for (int p = 0; p < P; ++p) {
        const __m256 uv = _mm256_broadcast_ss(ut + p);
        for (int h = 0; h < V8; ++h) acc[p][h] = _mm256_fmadd_ps(uv, vv[h], acc[p][h]);
      }
    }
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < V8; ++h) _mm256_storeu_ps(out[p] + 8 * h, acc[p][h]);
    return;
  }
#endif
  float acc[P][kOuterQ] = {};
  for (std::int64_t t = 0; t < k; ++t) {
    const float* vt = v + t * ldv;
    const float* ut = u + t * ldu;
    for (int p = 0; p < P; ++p)
      for (int q = 0; q < W; ++q) acc[p][q] = std::fma(ut[p], vt[q], acc[p][q]);
  }
  for (int p = 0; p < P; ++p)
    for (int q = 0; q < W; ++q) out[p][q] = acc[p][q];
}

template <int P>
void outer_cols(std::int64_t w, std::int64_t k, const float* u, std::int64_t ldu, const float* v, std::int64_t ldv,
                float out[kOuterP][kOuterQ]) {
  if (w == 16) return outer_block<P, 16>(k, u, ldu, v, ldv, out);
  if (w == 8) return outer_block<P, 8>(k, u, ldu, v, ldv, out);
  // Any other width: the scalar chain, the same arithmetic per element.
  float acc[P][kOuterQ] = {};
  for (std::int64_t t = 0; t < k; ++t)
    for (int p = 0; p < P; ++p)
      for (std::int64_t q = 0; q < w; ++q) acc[p][q] = std::fma(u[t * ldu + p], v[t * ldv + q], acc[p][q]);
  for (int p = 0; p < P; ++p)
    for (std::int64_t q = 0; q < w; ++q) out[p][q] = acc[p][q];
}

// U [k, np] (np <= kSkinny), V [k, nq]; C[p, q] (transpose_out false) or C[q, p].
void small_outer(std::int64_t np, std::int64_t nq, std::int64_t k, float alpha, const float* u, std::int64_t ldu,
                 const float* v, std::int64_t ldv, float beta, float* c, std::int64_t ldc, bool transpose_out) {
  // Blocks of 16 columns of V, then one of 8, then the rest: the split over threads is by block.
  const std::int64_t full = nq / kOuterQ, rest = nq % kOuterQ;
  const std::int64_t blocks = full + (rest >= 8 ? 1 : 0) + (rest % 8 != 0 ? 1 : 0);
  auto block_range = [&](std::int64_t blk, std::int64_t& q0, std::int64_t& w) {
    if (blk < full) {
      q0 = blk * kOuterQ;
      w = kOuterQ;
    } else if (blk == full && rest >= 8) {
      q0 = full * kOuterQ;
      w = 8;
    } else {
      q0 = full * kOuterQ + (rest >= 8 ? 8 : 0);
      w = nq - q0;
    }
  };
  parallel_for(blocks, row_grain(np * kOuterQ * k), [&](std::int64_t b0, std::int64_t b1) {
    float out[kOuterP][kOuterQ];
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      std::int64_t q0 = 0, w = 0;
      block_range(blk, q0, w);
      for (std::int64_t p0 = 0; p0 < np; p0 += kOuterP) {
        const std::int64_t pw = std::min<std::int64_t>(kOuterP, np - p0);
        switch (pw) {
          case 4: outer_cols<4>(w, k, u + p0, ldu, v + q0, ldv, out); break;
          case 3: outer_cols<3>(w, k, u + p0, ldu, v + q0, ldv, out); break;
          case 2: outer_cols<2>(w, k, u + p0, ldu, v + q0, ldv, out); break;
          default: outer_cols<1>(w, k, u + p0, ldu, v + q0, ldv, out); break;
        }
        for (std::int64_t p = 0; p < pw; ++p)
          for (std::int64_t q = 0; q < w; ++q) {
            float* cp = transpose_out ? c + (q0 + q) * ldc + (p0 + p) : c + (p0 + p) * ldc + (q0 + q);
            *cp = finish(out[p][q], alpha, beta, cp);
          }
      }
    }
  });
}

}  // namespace

bool skinny_gemm_applies(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k) {
  if (k < 64) return false;
  if (!trans_a) return n >= 1 && n <= kSkinny && m >= 16;
  if (trans_b) return false;
  return (m >= 1 && m <= kSkinny && n >= 16) || (n >= 1 && n <= kSkinny && m >= 16);
}

void skinny_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc) {
  if (!trans_a) return small_n(trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (m <= kSkinny) return small_outer(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, /*transpose_out=*/false);
  small_outer(n, m, k, alpha, b, ldb, a, lda, beta, c, ldc, /*transpose_out=*/true);
}

}  // namespace scalelab::kernels::cpu
