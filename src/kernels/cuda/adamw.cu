// AdamW and the gradient-norm helpers on the GPU (adamw family).
//
// adamw_update: one pass per batch of up to kMaxRanges ranges (the trainer merges adjacent
// parameters of equal decay, so a model has a few dozen), one block per tile of 1024 elements of
// a range (adamw_tiled_kernel; the first version, a grid-stride loop in which every element
// searched for its range, stays as adamw_kernel behind SCALELAB_CUDA_KERNELS=v1 for comparison).
// The arithmetic is the CPU's, operation by operation and with the same roundings, fused multiply-adds included (see adam_math), so results
// agree with the reference build to the last bit, and bf16 parameters are rounded
// stochastically with exactly the CPU's random bits (rounding_bits / stochastic_round_bf16 of
// cpu/adamw.cpp, ported below).
//
// sum_of_squares: each thread squares and adds up to kSquaresPerPartial elements in fp32, adds
// that partial to a double accumulator; threads and blocks combine in double in a fixed order
// (grid size a function of n only: deterministic). Error: every fp32 partial sums at most 16
// non-negative terms, so its relative error is below 16·2^-24 ≈ 1e-6, and the double reduction
// adds about log2(n)·2^-53; the total's relative error is therefore < 1.0e-6 (the CPU's own,
// with 8 fp32 accumulators over 8192 elements each, is bounded by ~5e-4 and typically ~1e-6).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/kernel_common.h"

namespace scalelab::kernels::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// Storage access by runtime dtype (a uniform branch: cheaper than 81 instantiations)
// ---------------------------------------------------------------------------------------------

enum StoreType : int { kStoreF32 = 0, kStoreBF16 = 1, kStoreF16 = 2 };

int store_type(DType t, const char* op) {
  switch (t) {
    case DType::kF32: return kStoreF32;
    case DType::kBF16: return kStoreBF16;
    case DType::kF16: return kStoreF16;
    default: throw RuntimeError(std::string("[") + op + "] unsupported dtype " + std::string(dtype_name(t)));
  }
}

__device__ __forceinline__ float load_as_f32(const void* p, int t, std::int64_t i) {
  if (t == kStoreF32) return static_cast<const float*>(p)[i];
  if (t == kStoreBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

// Round to nearest even (the CPU's conversion).
__device__ __forceinline__ void store_f32(void* p, int t, std::int64_t i, float x) {
  if (t == kStoreF32) {
    static_cast<float*>(p)[i] = x;
  } else if (t == kStoreBF16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  }
}

// ---------------------------------------------------------------------------------------------
// Stochastic rounding: the CPU's hash and rounding, bit for bit (cpu/adamw.cpp)
// ---------------------------------------------------------------------------------------------

__host__ __device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

__host__ __device__ __forceinline__ std::uint32_t rounding_bits_dev(std::uint64_t seed, std::int64_t step, std::int64_t index) {
  return static_cast<std::uint32_t>(mix64(seed ^ mix64(static_cast<std::uint64_t>(step) * 0x9e3779b97f4a7c15ull +
                                                       static_cast<std::uint64_t>(index))) &
                                    0xffffu);
}

// Up with probability equal to the remainder's fraction of the gap (16 random bits); NaN and
// infinity as the CPU's float_to_bf16 (quiet NaN keeps its payload's top bits; inf stays inf).
__host__ __device__ __forceinline__ std::uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

// (__host__ too, so that a host test can compare it with the CPU's functions.)
__host__ __device__ __forceinline__ std::uint16_t stochastic_round_bf16_dev(float x, std::uint32_t random16) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
    return static_cast<std::uint16_t>(u >> 16);  // ±inf: exact
  }
  u += random16 & 0xffffu;
  return static_cast<std::uint16_t>(u >> 16);
}

// ---------------------------------------------------------------------------------------------
// The update
// ---------------------------------------------------------------------------------------------

constexpr int kMaxRanges = 64;

// Kernel argument (≈1.8 KiB, under the 4 KiB parameter limit).
struct RangeBatch {
  int count;
  std::int64_t begin[kMaxRanges];
  std::int64_t offset[kMaxRanges + 1];  // prefix sums of the lengths: element i of the batch is in
                                        // range k when offset[k] <= i < offset[k + 1]
  float decay[kMaxRanges];              // 1 − lr·wd, or 1
  std::int64_t tile_offset[kMaxRanges + 1];  // prefix sums of each range's tiles (adamw_tiled_kernel)
};

struct AdamStep {
  float gs, b1, b2, omb1, omb2, step_size, bc2_sqrt, eps;
  std::uint64_t seed;
  std::int64_t step;
  std::int64_t index_base;  // AdamWHyper::index_base: added to an element's index for its random bits
};

// The CPU's expression with the CPU's roundings:
//   gi = g·gs;  m = b1·m + omb1·gi;  v = b2·v + omb2·gi·gi;  denom = sqrt(v)/bc2_sqrt + eps;
//   p = p·decay − step_size·(m/denom)
// The reference build (GCC, -O3 -march=x86-64-v3, whose C++ default is -ffp-contract=fast)
// contracts three of these into fused multiply-adds, in both of its loops (the fp32 one and the
// mixed-dtype one): m = fma(b1, m, omb1·gi), v = fma(b2, v, (omb2·gi)·gi) and
// p = fma(p, decay, −(step_size·(m/denom))). Checked bit for bit against the compiled CPU kernel
// on 20000 random elements (every element equal; no other contraction pattern was). The device
// spells those out with __fmaf_rn and every other operation with an explicit IEEE intrinsic, so
// nvcc contracts nothing else. (The decay 1 − lr·wd is the same with or without an FMA: lr·wd is
// far below 1, so its rounding error never reaches an ulp of 1.)
__device__ __forceinline__ void adam_math(float& p, float& m, float& v, float g, float decay, const AdamStep& s) {
  const float gi = __fmul_rn(g, s.gs);
  const float mi = __fmaf_rn(s.b1, m, __fmul_rn(s.omb1, gi));
  const float vi = __fmaf_rn(s.b2, v, __fmul_rn(__fmul_rn(s.omb2, gi), gi));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
  p = __fmaf_rn(p, decay, -__fmul_rn(s.step_size, __fdiv_rn(mi, denom)));
}

__global__ void adamw_kernel(void* params, int pt, void* m, int mt, void* v, int vt, const void* grads, int gt,
                             const RangeBatch batch, const AdamStep s) {
  const std::int64_t total = batch.offset[batch.count];
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    // The last range whose offset is <= i (ranges of zero length are skipped by the search).
    int lo = 0, hi = batch.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (batch.offset[mid] <= i) lo = mid; else hi = mid - 1;
    }
    const std::int64_t e = batch.begin[lo] + (i - batch.offset[lo]);
    float p = load_as_f32(params, pt, e), mi = load_as_f32(m, mt, e), vi = load_as_f32(v, vt, e);
    const float g = load_as_f32(grads, gt, e);
    adam_math(p, mi, vi, g, batch.decay[lo], s);
    store_f32(m, mt, e, mi);
    store_f32(v, vt, e, vi);
    if (pt == kStoreBF16) {
      static_cast<std::uint16_t*>(params)[e] = stochastic_round_bf16_dev(p, rounding_bits_dev(s.seed, s.step, s.index_base + e));
    } else {
      store_f32(params, pt, e, p);
    }
  }
}

// The update, tile by tile (the default; SCALELAB_CUDA_KERNELS=v1 selects adamw_kernel above for
// comparison). Each block owns one tile of kAdamTile consecutive elements of one range: it finds
// its range once (a binary search over tile_offset, the same for all its threads) instead of each
// element searching, and each thread loads its kAdamPerThread elements (strided by the block
// size, so each load instruction is coalesced across the warp) of all four tensors before doing
// any arithmetic: 16 independent loads in flight per thread rather than 4. The arithmetic per
// element is adam_math and the stochastic rounding as above: the same bits.
constexpr int kAdamThreads = 256;
constexpr int kAdamPerThread = 4;
constexpr std::int64_t kAdamTile = kAdamThreads * kAdamPerThread;

__global__ void __launch_bounds__(kAdamThreads) adamw_tiled_kernel(void* params, int pt, void* m, int mt, void* v,
                                                                   int vt, const void* grads, int gt,
                                                                   const RangeBatch batch, const AdamStep s) {
  const std::int64_t tile = blockIdx.x;
  int lo = 0, hi = batch.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (batch.tile_offset[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  const std::int64_t len = batch.offset[lo + 1] - batch.offset[lo];
  const std::int64_t first = (tile - batch.tile_offset[lo]) * kAdamTile;  // within the range
  const std::int64_t base = batch.begin[lo] + first;
  const std::int64_t n = min(kAdamTile, len - first);
  const float decay = batch.decay[lo];
  float P[kAdamPerThread], M[kAdamPerThread], V[kAdamPerThread], G[kAdamPerThread];
#pragma unroll
  for (int u = 0; u < kAdamPerThread; ++u) {
    const std::int64_t j = threadIdx.x + u * kAdamThreads;
    if (j < n) {
      const std::int64_t e = base + j;
      P[u] = load_as_f32(params, pt, e);
      M[u] = load_as_f32(m, mt, e);
      V[u] = load_as_f32(v, vt, e);
      G[u] = load_as_f32(grads, gt, e);
    }
  }
#pragma unroll
  for (int u = 0; u < kAdamPerThread; ++u) {
    const std::int64_t j = threadIdx.x + u * kAdamThreads;
    if (j < n) {
      const std::int64_t e = base + j;
      adam_math(P[u], M[u], V[u], G[u], decay, s);
      store_f32(m, mt, e, M[u]);
      store_f32(v, vt, e, V[u]);
      if (pt == kStoreBF16) {
        static_cast<std::uint16_t*>(params)[e] = stochastic_round_bf16_dev(P[u], rounding_bits_dev(s.seed, s.step, s.index_base + e));
      } else {
        store_f32(params, pt, e, P[u]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sum of squares, non-finite check, scaling
// ---------------------------------------------------------------------------------------------

constexpr int kSquaresPerPartial = 16;
constexpr int kNormThreads = 256;
constexpr int kNormBlocks = 1024;

__global__ void sum_squares_kernel(const void* g, int gt, std::int64_t n, double* partial) {
  __shared__ double sh[32];
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  while (i < n) {
    float part = 0.0f;
    for (int u = 0; u < kSquaresPerPartial && i < n; ++u, i += stride) {
      const float x = load_as_f32(g, gt, i);
      part = __fadd_rn(part, __fmul_rn(x, x));
    }
    acc += static_cast<double>(part);
  }
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_doubles_kernel(const double* __restrict__ partial, int n, double* out) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = s;
}

__global__ void non_finite_kernel(const void* g, int gt, std::int64_t n, unsigned int* flag) {
  bool bad = false;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    bad |= !isfinite(load_as_f32(g, gt, i));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(flag, 1u);
}

__global__ void scale_kernel(void* g, int gt, std::int64_t n, float factor) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store_f32(g, gt, i, __fmul_rn(load_as_f32(g, gt, i), factor));
  }
}

}  // namespace

void CudaBackend::adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads,
                               const std::vector<ElementRange>& ranges, const AdamWHyper& hp, ExecContext& ctx) {
  const char* op = "adamw_update";
  const std::int64_t n = params.numel();
  require_numel(m, n, op, "exp_avg");
  require_numel(v, n, op, "exp_avg_sq");
  require_numel(grads, n, op, "grads");
  const int pt = store_type(params.dtype(), op), mt = store_type(m.dtype(), op), vt = store_type(v.dtype(), op),
            gt = store_type(grads.dtype(), op);
  // The scalars exactly as the CPU forms them (double bias corrections rounded to float).
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  AdamStep s{};
  s.gs = hp.grad_scale;
  s.b1 = hp.beta1;
  s.b2 = hp.beta2;
  s.omb1 = 1.0f - hp.beta1;
  s.omb2 = 1.0f - hp.beta2;
  s.step_size = static_cast<float>(hp.lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = hp.eps;
  s.seed = hp.rounding_seed;
  s.step = hp.step;
  s.index_base = hp.index_base;
  const float lr_wd = hp.lr * hp.weight_decay;
  const float decay = 1.0f - lr_wd;

  RangeBatch batch{};
  auto flush = [&] {
    if (batch.count == 0) return;
    const std::int64_t total = batch.offset[batch.count];
    const std::int64_t tiles = batch.tile_offset[batch.count];
    if (total > 0 && cuda_kernels_v1()) {
      adamw_kernel<<<grid_for(total), 256, 0, stream()>>>(params.raw(), pt, m.raw(), mt, v.raw(), vt, grads.raw(), gt,
                                                          batch, s);
      check_launch(op);
    } else if (total > 0) {
      SCALELAB_CHECK(tiles <= 0x7fffffffLL, "[adamw_update] too many elements for one launch");
      adamw_tiled_kernel<<<static_cast<unsigned>(tiles), kAdamThreads, 0, stream()>>>(
          params.raw(), pt, m.raw(), mt, v.raw(), vt, grads.raw(), gt, batch, s);
      check_launch(op);
    }
    batch = RangeBatch{};
  };
  for (const auto& r : ranges) {
    SCALELAB_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= n, "[adamw_update] range outside the buffer");
    if (r.end == r.begin) continue;
    if (batch.count == kMaxRanges) flush();
    const int k = batch.count++;
    batch.begin[k] = r.begin;
    batch.offset[k + 1] = batch.offset[k] + (r.end - r.begin);
    batch.tile_offset[k + 1] = batch.tile_offset[k] + (r.end - r.begin + kAdamTile - 1) / kAdamTile;
    batch.decay[k] = r.decay ? decay : 1.0f;
  }
  flush();
}

double CudaBackend::sum_of_squares(const Tensor& g, ExecContext& ctx) {
  const char* op = "sum_of_squares";
  const std::int64_t n = g.numel();
  if (n == 0) return 0.0;
  const int gt = store_type(g.dtype(), op);
  const std::int64_t per_block = static_cast<std::int64_t>(kNormThreads) * kSquaresPerPartial;
  const int blocks = static_cast<int>(std::min<std::int64_t>(kNormBlocks, (n + per_block - 1) / per_block));
  Tensor scratch = Tensor::empty({2 * (blocks + 1)}, DType::kF32, *ctx.alloc, "norm reduction");  // doubles
  double* partial = static_cast<double*>(scratch.raw());
  sum_squares_kernel<<<blocks, kNormThreads, 0, stream()>>>(g.raw(), gt, n, partial);
  check_launch(op);
  sum_doubles_kernel<<<1, kNormThreads, 0, stream()>>>(partial, blocks, partial + blocks);
  check_launch(op);
  double out = 0.0;
  check(cudaMemcpyAsync(&out, partial + blocks, sizeof out, cudaMemcpyDeviceToHost, stream()), op);
  check(cudaStreamSynchronize(stream()), op);
  return out;
}

bool CudaBackend::has_non_finite(const Tensor& g, ExecContext& ctx) {
  const char* op = "has_non_finite";
  const std::int64_t n = g.numel();
  if (n == 0) return false;
  const int gt = store_type(g.dtype(), op);
  Tensor scratch = Tensor::empty({1}, DType::kF32, *ctx.alloc, "norm reduction");
  auto* flag = static_cast<unsigned int*>(scratch.raw());
  check(cudaMemsetAsync(flag, 0, sizeof(unsigned int), stream()), op);
  non_finite_kernel<<<std::min<unsigned>(grid_for(n), 4096), 256, 0, stream()>>>(g.raw(), gt, n, flag);
  check_launch(op);
  unsigned int h = 0;
  check(cudaMemcpyAsync(&h, flag, sizeof h, cudaMemcpyDeviceToHost, stream()), op);
  check(cudaStreamSynchronize(stream()), op);
  return h != 0;
}

void CudaBackend::scale_(Tensor& g, float factor, ExecContext& ctx) {
  const char* op = "scale_";
  const std::int64_t n = g.numel();
  if (n == 0) return;
  const int gt = store_type(g.dtype(), op);
  scale_kernel<<<grid_for(n), 256, 0, stream()>>>(g.raw(), gt, n, factor);
  check_launch(op);
}

}  // namespace scalelab::kernels::cuda
