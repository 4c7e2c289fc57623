#pragma once
// Warp and block reductions shared by the CUDA kernels (sums, maxima, an online log-sum-exp).
//
// Block helpers assume blockDim.x is a multiple of 32 and at most 1024 (1-D blocks), that every
// thread of the block calls them (they contain __syncthreads), and return the result to EVERY
// thread. Each takes a __shared__ scratch of at least 32 elements of its type; it may be reused
// by the next call (the helpers synchronize before returning and before overwriting it).
// The order of the additions is fixed by the block shape, so results are deterministic.
#include <cuda_runtime.h>

#include <cmath>

namespace scalelab::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block; every thread gets the result.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // the scratch may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = lane < warps ? shared[lane] : T(0);
  r = warp_sum(r);
  return r;
}

// Max over the block; every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(r);
}

// Online log-sum-exp state: the running max m and Σ exp(x − m). Empty: m = −inf, s = 0.
struct LseState {
  float m;
  float s;
};

__device__ __forceinline__ LseState lse_push(LseState a, float x) {
  if (x == -INFINITY) return a;  // exp(−inf) = 0 (and avoids −inf − −inf = NaN on an empty state)
  if (x > a.m) {
    // exp(−inf) = 0 covers the empty state.
    a.s = a.s * expf(a.m - x) + 1.0f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);
  }
  return a;
}

__device__ __forceinline__ LseState lse_merge(LseState a, LseState b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  if (a.m >= b.m) return {a.m, a.s + b.s * expf(b.m - a.m)};
  return {b.m, b.s + a.s * expf(a.m - b.m)};
}

__device__ __forceinline__ LseState warp_lse(LseState v) {
  for (int o = 16; o > 0; o >>= 1) {
    LseState u{__shfl_xor_sync(kFullMask, v.m, o), __shfl_xor_sync(kFullMask, v.s, o)};
    v = lse_merge(v, u);
  }
  return v;
}

// Log-sum-exp state over the block; every thread gets it. shared: at least 32 LseState.
__device__ __forceinline__ LseState block_lse(LseState v, LseState* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_lse(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  LseState r = lane < warps ? shared[lane] : LseState{-INFINITY, 0.0f};
  return warp_lse(r);
}

}  // namespace scalelab::kernels::cuda
