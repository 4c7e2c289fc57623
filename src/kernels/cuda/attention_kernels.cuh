#pragma once
// The attention kernels of the CUDA backend (the design is described at the top of
// attention_eager.cu). Kept apart from the host code: they depend only on a few device intrinsics
// and on to_f32/from_f32 (common.cuh, included first by attention_launch.cuh).
#include <cstddef>
#include <cstdint>

namespace scalelab::kernels::cuda::attn {

constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// What every kernel needs of the shape (sizes fit int: S ≤ 2^31, widths ≤ 2^31).
struct Geo {
  int S = 0, nh = 0, nkv = 0, group = 0, hd = 0;
  std::int64_t ld = 0, ldo = 0;  // row widths of qkv and out
  int k_off = 0, v_off = 0;      // first column of the key heads and of the value heads in a qkv row
  float scale = 0, c2 = 0;       // scale and scale · log2(e)
};

// Tile sizes. Forward and the rows backward: BR query rows × BC keys; cols backward: BK keys × BQ
// query rows. Chosen so that each thread keeps ≤ 64 fp32 accumulators of the head dim.
template <int HD>
struct Cfg {
  static constexpr int BR = HD <= 128 ? 64 : 32;                  // forward / rows-backward rows
  static constexpr int BC = 64;                                   // forward keys
  static constexpr int BC_ROWS = HD <= 64 ? 64 : 32;              // rows-backward keys
  static constexpr int BK = HD <= 64 ? 64 : (HD <= 128 ? 32 : 16);  // cols-backward keys
  static constexpr int BQ = 32;                                   // cols-backward query rows
  static constexpr int LDH = HD + 1;
};

struct Lane {
  int warp, rg, cg;
};
__device__ __forceinline__ Lane lane_of() {
  const int t = static_cast<int>(threadIdx.x);
  return {t >> 5, (t & 31) >> 3, t & 7};
}

__device__ __forceinline__ float group8_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  return v;
}
__device__ __forceinline__ float group8_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// dst[r][d] (leading dim lds, ROWS × HD) = src[(row0 + r) * ldg + d] in fp32; zero for rows
// r >= nvalid and columns d >= hd (the padding of the tile). src points at column 0 of the head.
template <class T, int HD, int ROWS>
__device__ __forceinline__ void load_rows(float* dst, int lds, const T* __restrict__ src, std::int64_t ldg, int row0,
                                          int nvalid, int hd) {
  for (int idx = threadIdx.x; idx < ROWS * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    float v = 0.0f;
    if (r < nvalid && d < hd) v = to_f32<T>(src[static_cast<std::int64_t>(row0 + r) * ldg + d]);
    dst[r * lds + d] = v;
  }
}

// acc[i][j] = Σ_d A[a0 + 4i][d] · B[b0 + 8j][d]   (A, B in shared memory, leading dim ld)
template <int NI, int NJ, int HD>
__device__ __forceinline__ void dot_tile(float (&acc)[NI][NJ], const float* A, int a0, const float* B, int b0,
                                         int ld) {
#pragma unroll
  for (int i = 0; i < NI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < HD; ++d) {
    float a[NI], b[NJ];
#pragma unroll
    for (int i = 0; i < NI; ++i) a[i] = A[(a0 + 4 * i) * ld + d];
#pragma unroll
    for (int j = 0; j < NJ; ++j) b[j] = B[(b0 + 8 * j) * ld + d];
#pragma unroll
    for (int i = 0; i < NI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// acc[i][j] += Σ_{k<K} P[p0 + 4i][k] · M[k][cg + 8j]   (P leading dim ldp, M leading dim ldm)
template <int NI, int NJ, int K>
__device__ __forceinline__ void mul_acc(float (&acc)[NI][NJ], const float* P, int p0, int ldp, const float* M, int ldm,
                                        int cg) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float p[NI], m[NJ];
#pragma unroll
    for (int i = 0; i < NI; ++i) p[i] = P[(p0 + 4 * i) * ldp + k];
#pragma unroll
    for (int j = 0; j < NJ; ++j) m[j] = M[k * ldm + cg + 8 * j];
#pragma unroll
    for (int i = 0; i < NI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] = fmaf(p[i], m[j], acc[i][j]);
  }
}

// dst[(row_base + 4i) * ldg + cg + 8j] = acc[i][j] · mul[i] for rows < S and columns < hd.
template <class T, int NI, int NJ>
__device__ __forceinline__ void store_rows(T* __restrict__ dst, std::int64_t ldg, const float (&acc)[NI][NJ],
                                           const float (&mul)[NI], int row_base, int S, int hd, int cg) {
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int row = row_base + 4 * i;
    if (row >= S) continue;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int d = cg + 8 * j;
      if (d < hd) dst[static_cast<std::int64_t>(row) * ldg + d] = from_f32<T>(acc[i][j] * mul[i]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

template <int HD>
constexpr std::size_t fwd_smem() {  // Q, K-or-V, P tiles
  using C = Cfg<HD>;
  return sizeof(float) * (C::BR * C::LDH + C::BC * C::LDH + C::BR * (C::BC + 8));
}

// Flash forward: grid (row tiles, nh, B), the heaviest (last) row tiles first.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(T* __restrict__ out, float* __restrict__ lse,
                                                             const T* __restrict__ qkv, Geo g) {
  using C = Cfg<HD>;
  constexpr int BR = C::BR, BC = C::BC, LDH = C::LDH, LDP = BC + 8;
  constexpr int NI = BR / 16, NJ = BC / 8, ND = HD / 8;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* KVs = Qs + BR * LDH;
  float* Ps = KVs + BC * LDH;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group;
  const Lane ln = lane_of();
  const int r0 = ln.warp * (BR / 4) + ln.rg;  // this thread's tile rows: r0 + 4i
  const T* base = qkv + static_cast<std::int64_t>(b) * g.S * g.ld;

  load_rows<T, HD, BR>(Qs, LDH, base + h * g.hd, g.ld, q0, g.S - q0, g.hd);
  float m[NI], l[NI], o[NI][ND];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < ND; ++j) o[i][j] = 0.0f;
  }
  const int kend = min(q0 + BR, g.S);  // keys [0, kend) are visible to some row of the tile
  for (int c0 = 0; c0 < kend; c0 += BC) {
    __syncthreads();  // the previous tile's reads of V and P are done (and Q is visible)
    load_rows<T, HD, BC>(KVs, LDH, base + g.k_off + kvh * g.hd, g.ld, c0, g.S - c0, g.hd);
    __syncthreads();
    float s[NI][NJ];
    dot_tile<NI, NJ, HD>(s, Qs, r0, KVs, ln.cg, LDH);
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int row = q0 + r0 + 4 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int col = c0 + ln.cg + 8 * j;
        s[i][j] = (col <= row && col < g.S) ? s[i][j] * g.c2 : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = group8_max(mx);
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no visible key yet: all p = 0
      const float alpha = exp2f(m[i] - m_use);                // 0 on the first visible tile (m = -inf)
      m[i] = m_new;
      float ls = 0.0f;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const float p = exp2f(s[i][j] - m_use);
        ls += p;
        Ps[(r0 + 4 * i) * LDP + ln.cg + 8 * j] = p;
      }
      l[i] = l[i] * alpha + ls;  // this lane's partial row sum; alpha is the same on the 8 lanes
#pragma unroll
      for (int j = 0; j < ND; ++j) o[i][j] *= alpha;
    }
    __syncthreads();  // every read of K is done before V overwrites it; P is visible
    load_rows<T, HD, BC>(KVs, LDH, base + g.v_off + kvh * g.hd, g.ld, c0, g.S - c0, g.hd);
    __syncthreads();
    mul_acc<NI, ND, BC>(o, Ps, r0, LDP, KVs, LDH, ln.cg);
  }
  float inv[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const float lt = group8_sum(l[i]);
    inv[i] = lt > 0.0f ? 1.0f / lt : 0.0f;
    const int row = q0 + r0 + 4 * i;
    if (ln.cg == 0 && row < g.S)
      lse[(static_cast<std::int64_t>(b) * g.nh + h) * g.S + row] = lt > 0.0f ? m[i] * kLn2 + logf(lt) : -INFINITY;
  }
  store_rows<T, NI, ND>(out + static_cast<std::int64_t>(b) * g.S * g.ldo + h * g.hd, g.ldo, o, inv, q0 + r0, g.S,
                        g.hd, ln.cg);
}

// Eager forward, part 1: probs[b, h, row, :] = softmax over the visible keys, zeros above the
// diagonal, for the BR rows of the tile (grid as the flash forward).
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) eager_probs_kernel(T* __restrict__ probs, const T* __restrict__ qkv,
                                                               Geo g) {
  using C = Cfg<HD>;
  constexpr int BR = C::BR, BC = C::BC, LDH = C::LDH, LDP = BC + 8;
  constexpr int NI = BR / 16, NJ = BC / 8;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + BR * LDH;
  float* Ps = Ks + BC * LDH;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group;
  const Lane ln = lane_of();
  const int r0 = ln.warp * (BR / 4) + ln.rg;
  const T* base = qkv + static_cast<std::int64_t>(b) * g.S * g.ld;
  const T* kbase = base + g.k_off + kvh * g.hd;
  T* P = probs + (static_cast<std::int64_t>(b) * g.nh + h) * g.S * g.S;

  load_rows<T, HD, BR>(Qs, LDH, base + h * g.hd, g.ld, q0, g.S - q0, g.hd);
  float m[NI], l[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  const int kend = min(q0 + BR, g.S);
  // Pass 1: running max and sum of each row.
  for (int c0 = 0; c0 < kend; c0 += BC) {
    __syncthreads();
    load_rows<T, HD, BC>(Ks, LDH, kbase, g.ld, c0, g.S - c0, g.hd);
    __syncthreads();
    float s[NI][NJ];
    dot_tile<NI, NJ, HD>(s, Qs, r0, Ks, ln.cg, LDH);
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int row = q0 + r0 + 4 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int col = c0 + ln.cg + 8 * j;
        s[i][j] = (col <= row && col < g.S) ? s[i][j] * g.c2 : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = group8_max(mx);
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      float ls = 0.0f;
#pragma unroll
      for (int j = 0; j < NJ; ++j) ls += exp2f(s[i][j] - m_use);
      l[i] = l[i] * exp2f(m[i] - m_use) + ls;
      m[i] = m_new;
    }
  }
  float inv[NI], shift[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const float lt = group8_sum(l[i]);
    inv[i] = lt > 0.0f ? 1.0f / lt : 0.0f;
    shift[i] = m[i] == -INFINITY ? 0.0f : m[i];
  }
  // Pass 2: every key tile of the row (zeros past the diagonal), staged in shared memory so that
  // the stores are coalesced.
  for (int c0 = 0; c0 < g.S; c0 += BC) {
    __syncthreads();  // the previous tile's stores have read Ps; its dot products have read Ks
    const bool visible = c0 < kend;  // uniform over the block
    if (visible) {
      load_rows<T, HD, BC>(Ks, LDH, kbase, g.ld, c0, g.S - c0, g.hd);
      __syncthreads();
      float s[NI][NJ];
      dot_tile<NI, NJ, HD>(s, Qs, r0, Ks, ln.cg, LDH);
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int row = q0 + r0 + 4 * i;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const int col = c0 + ln.cg + 8 * j;
          const float p = (col <= row && col < g.S) ? exp2f(s[i][j] * g.c2 - shift[i]) * inv[i] : 0.0f;
          Ps[(r0 + 4 * i) * LDP + ln.cg + 8 * j] = p;
        }
      }
      __syncthreads();
    }
    for (int idx = threadIdx.x; idx < BR * BC; idx += kThreads) {
      const int r = idx / BC, c = idx % BC, row = q0 + r, col = c0 + c;
      if (row < g.S && col < g.S)
        P[static_cast<std::int64_t>(row) * g.S + col] = from_f32<T>(visible ? Ps[r * LDP + c] : 0.0f);
    }
  }
}

template <int HD>
constexpr std::size_t pv_smem() {  // V and P tiles
  using C = Cfg<HD>;
  return sizeof(float) * (C::BC * C::LDH + C::BR * (C::BC + 8));
}

// Eager forward, part 2: out = P V with the stored (rounded) probabilities.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads) eager_pv_kernel(T* __restrict__ out, const T* __restrict__ probs,
                                                            const T* __restrict__ qkv, Geo g) {
  using C = Cfg<HD>;
  constexpr int BR = C::BR, BC = C::BC, LDH = C::LDH, LDP = BC + 8;
  constexpr int NI = BR / 16, ND = HD / 8;
  extern __shared__ float smem[];
  float* Vs = smem;
  float* Ps = Vs + BC * LDH;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group;
  const Lane ln = lane_of();
  const int r0 = ln.warp * (BR / 4) + ln.rg;
  const T* vbase = qkv + static_cast<std::int64_t>(b) * g.S * g.ld + g.v_off + kvh * g.hd;
  const T* P = probs + (static_cast<std::int64_t>(b) * g.nh + h) * g.S * g.S;
  float o[NI][ND], one[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    one[i] = 1.0f;
#pragma unroll
    for (int j = 0; j < ND; ++j) o[i][j] = 0.0f;
  }
  const int kend = min(q0 + BR, g.S);
  for (int c0 = 0; c0 < kend; c0 += BC) {
    __syncthreads();
    load_rows<T, HD, BC>(Vs, LDH, vbase, g.ld, c0, g.S - c0, g.hd);
    for (int idx = threadIdx.x; idx < BR * BC; idx += kThreads) {
      const int r = idx / BC, c = idx % BC, row = q0 + r, col = c0 + c;
      Ps[r * LDP + c] =
          (row < g.S && col <= row) ? to_f32<T>(P[static_cast<std::int64_t>(row) * g.S + col]) : 0.0f;
    }
    __syncthreads();
    mul_acc<NI, ND, BC>(o, Ps, r0, LDP, Vs, LDH, ln.cg);
  }
  store_rows<T, NI, ND>(out + static_cast<std::int64_t>(b) * g.S * g.ldo + h * g.hd, g.ldo, o, one, q0 + r0, g.S,
                        g.hd, ln.cg);
}

// ---------------------------------------------------------------------------------------------
// Backward

// Flash: D[b, h, s] = Σ_d dO · O (one warp per (token, head)).
template <class T>
__global__ void __launch_bounds__(kThreads) flash_rowdot_kernel(float* __restrict__ D, const T* __restrict__ dout,
                                                                const T* __restrict__ out, Geo g, std::int64_t n) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kThreads / 32);
  for (std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5); w < n;
       w += warps) {
    const std::int64_t t = w / g.nh;  // token b·S + s
    const int h = static_cast<int>(w % g.nh);
    const std::int64_t off = t * g.ldo + static_cast<std::int64_t>(h) * g.hd;
    float acc = 0.0f;
    for (int d = lane; d < g.hd; d += 32) acc = fmaf(to_f32<T>(dout[off + d]), to_f32<T>(out[off + d]), acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      const std::int64_t b = t / g.S, s = t % g.S;
      D[(b * g.nh + h) * g.S + s] = acc;
    }
  }
}

template <int HD>
constexpr std::size_t rows_smem() {  // Q, dO, K, V, dS (P when eager)
  using C = Cfg<HD>;
  return sizeof(float) * (2 * C::BR * C::LDH + 2 * C::BC_ROWS * C::LDH + C::BR * (C::BC_ROWS + 8));
}

// dQ[row] = scale · Σ_key dS[row][key] K[key], dS = P ⊙ (dP − D), dP = dO V^T.
// Flash: P = exp(scale·QK^T − lse), D read from the workspace. Eager: P from probs, and a first
// pass computes D = Σ_key P·dP (the CPU's dot) and writes it to the workspace for the cols kernel.
template <class T, int HD, bool EAGER>
__global__ void __launch_bounds__(kThreads) bwd_rows_kernel(T* __restrict__ dqkv, float* __restrict__ Dws,
                                                            const T* __restrict__ dout, const T* __restrict__ probs,
                                                            const float* __restrict__ lse,
                                                            const T* __restrict__ qkv, Geo g) {
  using C = Cfg<HD>;
  constexpr int BR = C::BR, BC = C::BC_ROWS, LDH = C::LDH, LDP = BC + 8;
  constexpr int NI = BR / 16, NJ = BC / 8, ND = HD / 8;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* dOs = Qs + BR * LDH;
  float* Ks = dOs + BR * LDH;
  float* Vs = Ks + BC * LDH;
  float* dSs = Vs + BC * LDH;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * BR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / g.group;
  const Lane ln = lane_of();
  const int r0 = ln.warp * (BR / 4) + ln.rg;
  const T* base = qkv + static_cast<std::int64_t>(b) * g.S * g.ld;
  const T* kbase = base + g.k_off + kvh * g.hd;
  const T* vbase = base + g.v_off + kvh * g.hd;
  const std::int64_t rowbase = (static_cast<std::int64_t>(b) * g.nh + h) * g.S;  // row 0 of (b, h) in lse, D
  const T* P = EAGER ? probs + rowbase * g.S : nullptr;

  if constexpr (!EAGER) load_rows<T, HD, BR>(Qs, LDH, base + h * g.hd, g.ld, q0, g.S - q0, g.hd);
  load_rows<T, HD, BR>(dOs, LDH, dout + static_cast<std::int64_t>(b) * g.S * g.ldo + h * g.hd, g.ldo, q0, g.S - q0,
                       g.hd);
  const int kend = min(q0 + BR, g.S);
  // Loads the probabilities of key tile c0 into dSs (zero where masked or out of range).
  auto load_p = [&](int c0) {
    for (int idx = threadIdx.x; idx < BR * BC; idx += kThreads) {
      const int r = idx / BC, c = idx % BC, row = q0 + r, col = c0 + c;
      dSs[r * LDP + c] =
          (row < g.S && col <= row) ? to_f32<T>(P[static_cast<std::int64_t>(row) * g.S + col]) : 0.0f;
    }
  };
  float lse2[NI], Dr[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int row = min(q0 + r0 + 4 * i, g.S - 1);  // rows past S read a valid entry, never used
    lse2[i] = EAGER ? 0.0f : lse[rowbase + row] * kLog2e;
    Dr[i] = EAGER ? 0.0f : Dws[rowbase + row];
  }
  if constexpr (EAGER) {
    float acc[NI];
#pragma unroll
    for (int i = 0; i < NI; ++i) acc[i] = 0.0f;
    for (int c0 = 0; c0 < kend; c0 += BC) {
      __syncthreads();
      load_rows<T, HD, BC>(Vs, LDH, vbase, g.ld, c0, g.S - c0, g.hd);
      load_p(c0);
      __syncthreads();
      float dp[NI][NJ];
      dot_tile<NI, NJ, HD>(dp, dOs, r0, Vs, ln.cg, LDH);
#pragma unroll
      for (int i = 0; i < NI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) acc[i] = fmaf(dSs[(r0 + 4 * i) * LDP + ln.cg + 8 * j], dp[i][j], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      Dr[i] = group8_sum(acc[i]);
      const int row = q0 + r0 + 4 * i;
      if (ln.cg == 0 && row < g.S) Dws[rowbase + row] = Dr[i];
    }
  }
  float dq[NI][ND];
#pragma unroll
  for (int i = 0; i < NI; ++i)
#pragma unroll
    for (int j = 0; j < ND; ++j) dq[i][j] = 0.0f;
  for (int c0 = 0; c0 < kend; c0 += BC) {
    __syncthreads();  // previous reads of K and dS done (and Q, dO visible)
    load_rows<T, HD, BC>(Ks, LDH, kbase, g.ld, c0, g.S - c0, g.hd);
    load_rows<T, HD, BC>(Vs, LDH, vbase, g.ld, c0, g.S - c0, g.hd);
    if constexpr (EAGER) load_p(c0);
    __syncthreads();
    float dp[NI][NJ];
    dot_tile<NI, NJ, HD>(dp, dOs, r0, Vs, ln.cg, LDH);
    float s[NI][NJ] = {};
    if constexpr (!EAGER) dot_tile<NI, NJ, HD>(s, Qs, r0, Ks, ln.cg, LDH);
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int row = q0 + r0 + 4 * i;
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int col = c0 + ln.cg + 8 * j;
        float* e = &dSs[(r0 + 4 * i) * LDP + ln.cg + 8 * j];  // this thread's own element
        float p;
        if constexpr (EAGER) p = *e;
        else p = (col <= row && col < g.S) ? exp2f(s[i][j] * g.c2 - lse2[i]) : 0.0f;
        *e = p * (dp[i][j] - Dr[i]);
      }
    }
    __syncthreads();
    mul_acc<NI, ND, BC>(dq, dSs, r0, LDP, Ks, LDH, ln.cg);
  }
  float sc[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) sc[i] = g.scale;
  store_rows<T, NI, ND>(dqkv + static_cast<std::int64_t>(b) * g.S * g.ld + h * g.hd, g.ld, dq, sc, q0 + r0, g.S, g.hd,
                        ln.cg);
}

template <int HD>
constexpr std::size_t cols_smem() {  // K, V, Q, dO, P^T, dS^T, lse, D
  using C = Cfg<HD>;
  return sizeof(float) * (2 * C::BK * C::LDH + 2 * C::BQ * C::LDH + 2 * C::BK * (C::BQ + 8) + 2 * C::BQ);
}

// dV[key] = Σ_h Σ_row P[row][key] dO[row],  dK[key] = scale · Σ_h Σ_row dS[row][key] Q[row] over the
// query heads h of kv head blockIdx.y; grid (key tiles, nkv, B), key tile 0 (the most rows) first.
template <class T, int HD, bool EAGER>
__global__ void __launch_bounds__(kThreads) bwd_cols_kernel(T* __restrict__ dqkv, const float* __restrict__ Dws,
                                                            const T* __restrict__ dout, const T* __restrict__ probs,
                                                            const float* __restrict__ lse,
                                                            const T* __restrict__ qkv, Geo g) {
  using C = Cfg<HD>;
  constexpr int BK = C::BK, BQ = C::BQ, LDH = C::LDH, LDP = BQ + 8;
  constexpr int NI = BK / 16, NJ = BQ / 8, ND = HD / 8;
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = Ks + BK * LDH;
  float* Qs = Vs + BK * LDH;
  float* dOs = Qs + BQ * LDH;
  float* Ps = dOs + BQ * LDH;  // P^T [key][row]
  float* dSs = Ps + BK * LDP;  // dS^T [key][row]
  float* lse2s = dSs + BK * LDP;
  float* Ds = lse2s + BQ;
  const int k0 = blockIdx.x * BK;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const Lane ln = lane_of();
  const int kr0 = ln.warp * (BK / 4) + ln.rg;  // this thread's keys: kr0 + 4i
  const T* base = qkv + static_cast<std::int64_t>(b) * g.S * g.ld;
  const T* dbase = dout + static_cast<std::int64_t>(b) * g.S * g.ldo;

  load_rows<T, HD, BK>(Ks, LDH, base + g.k_off + kvh * g.hd, g.ld, k0, g.S - k0, g.hd);
  load_rows<T, HD, BK>(Vs, LDH, base + g.v_off + kvh * g.hd, g.ld, k0, g.S - k0, g.hd);
  float dk[NI][ND], dv[NI][ND];
#pragma unroll
  for (int i = 0; i < NI; ++i)
#pragma unroll
    for (int j = 0; j < ND; ++j) dk[i][j] = dv[i][j] = 0.0f;

  for (int hh = 0; hh < g.group; ++hh) {
    const int h = kvh * g.group + hh;
    const std::int64_t rowbase = (static_cast<std::int64_t>(b) * g.nh + h) * g.S;
    const T* P = EAGER ? probs + rowbase * g.S : nullptr;
    for (int q0 = k0 / BQ * BQ; q0 < g.S; q0 += BQ) {  // rows below k0 see none of these keys
      __syncthreads();  // previous reads of Q, dO, P^T, dS^T, lse, D done (and K, V visible)
      load_rows<T, HD, BQ>(Qs, LDH, base + h * g.hd, g.ld, q0, g.S - q0, g.hd);
      load_rows<T, HD, BQ>(dOs, LDH, dbase + h * g.hd, g.ldo, q0, g.S - q0, g.hd);
      for (int t = threadIdx.x; t < BQ; t += kThreads) {
        const int row = q0 + t;
        lse2s[t] = (!EAGER && row < g.S) ? lse[rowbase + row] * kLog2e : 0.0f;
        Ds[t] = row < g.S ? Dws[rowbase + row] : 0.0f;
      }
      if constexpr (EAGER) {
        for (int idx = threadIdx.x; idx < BQ * BK; idx += kThreads) {
          const int r = idx / BK, c = idx % BK, row = q0 + r, key = k0 + c;  // coalesced over keys
          Ps[c * LDP + r] =
              (row < g.S && key <= row) ? to_f32<T>(P[static_cast<std::int64_t>(row) * g.S + key]) : 0.0f;
        }
      }
      __syncthreads();
      float dp[NI][NJ];
      dot_tile<NI, NJ, HD>(dp, Vs, kr0, dOs, ln.cg, LDH);  // dP^T[key][row] = V[key] · dO[row]
      float s[NI][NJ] = {};
      if constexpr (!EAGER) dot_tile<NI, NJ, HD>(s, Ks, kr0, Qs, ln.cg, LDH);
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int key = k0 + kr0 + 4 * i;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const int r = ln.cg + 8 * j, row = q0 + r;
          const int e = (kr0 + 4 * i) * LDP + r;  // this thread's own element
          float p;
          if constexpr (EAGER) {
            p = Ps[e];
          } else {
            p = (key <= row && row < g.S && key < g.S) ? exp2f(s[i][j] * g.c2 - lse2s[r]) : 0.0f;
            Ps[e] = p;
          }
          dSs[e] = p * (dp[i][j] - Ds[r]);
        }
      }
      __syncthreads();
      mul_acc<NI, ND, BQ>(dv, Ps, kr0, LDP, dOs, LDH, ln.cg);
      mul_acc<NI, ND, BQ>(dk, dSs, kr0, LDP, Qs, LDH, ln.cg);
    }
  }
  float sc[NI], one[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    sc[i] = g.scale;
    one[i] = 1.0f;
  }
  store_rows<T, NI, ND>(dqkv + static_cast<std::int64_t>(b) * g.S * g.ld + g.k_off + kvh * g.hd, g.ld, dk, sc,
                        k0 + kr0, g.S, g.hd, ln.cg);
  store_rows<T, NI, ND>(dqkv + static_cast<std::int64_t>(b) * g.S * g.ld + g.v_off + kvh * g.hd, g.ld, dv, one,
                        k0 + kr0, g.S, g.hd, ln.cg);
}

}  // namespace scalelab::kernels::cuda::attn
