#pragma once
// Device helpers shared by the row-wise CUDA kernels (norm, elementwise, embedding, rope,
// dropout): typed element access with the dtype chosen at run time, warp and block sums, the
// CPU's exp polynomial, and a deterministic column sum (parameter gradients summed over rows).
//
// Element access: each tensor of a call may have its own storage dtype (fp32 master weights next
// to bf16 activations under mixed precision, as the CPU kernels allow), so kernels take
// In/Out handles that carry the dtype and convert to and from fp32 per element. The switch is
// uniform across a warp and costs a few integer instructions per element of a memory-bound
// kernel. Conversions round to nearest even (common.cuh), as the CPU's do.
//
// Everything here is a template or inline, so several .cu files include it without clashes.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace scalelab::kernels::cuda {

// ---------------------------------------------------------------------------------------------
// Typed element access
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float load_as_f32(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_from_f32(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); return;
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); return;
    default: static_cast<float*>(p)[i] = v; return;
  }
}

// The value v takes once stored in dtype t and read back (identity for fp32).
__device__ __forceinline__ float round_to(DType t, float v) {
  switch (t) {
    case DType::kBF16: return __bfloat162float(__float2bfloat16_rn(v));
    case DType::kF16: return __half2float(__float2half_rn(v));
    default: return v;
  }
}

// A read-only float tensor (or nothing: p == nullptr).
struct In {
  const void* p = nullptr;
  DType t = DType::kF32;
  __device__ __forceinline__ float operator[](std::int64_t i) const { return load_as_f32(p, t, i); }
  __host__ __device__ __forceinline__ bool present() const { return p != nullptr; }
};

// A written float tensor (or nothing).
struct Out {
  void* p = nullptr;
  DType t = DType::kF32;
  __device__ __forceinline__ float operator[](std::int64_t i) const { return load_as_f32(p, t, i); }
  __device__ __forceinline__ void set(std::int64_t i, float v) const { store_from_f32(p, t, i, v); }
  __device__ __forceinline__ float rounded(float v) const { return round_to(t, v); }
  __host__ __device__ __forceinline__ bool present() const { return p != nullptr; }
};

inline In in_of(const Tensor& t) { return t.defined() ? In{t.raw(), t.dtype()} : In{}; }
inline In in_of(const Tensor* t) { return (t != nullptr && t->defined()) ? In{t->raw(), t->dtype()} : In{}; }
inline Out out_of(Tensor& t) { return t.defined() ? Out{t.raw(), t.dtype()} : Out{}; }
inline Out out_of(Tensor* t) { return (t != nullptr && t->defined()) ? Out{t->raw(), t->dtype()} : Out{}; }

// Throws naming the op when a tensor is not a float type the kernels read.
inline void require_float(const Tensor& t, const char* op, const char* name) {
  if (t.defined() && !(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16)) {
    throw RuntimeError(std::string("[") + op + "] " + name + " must be fp32, bf16 or fp16, got " +
                       std::string(dtype_name(t.dtype())));
  }
}
inline void require_cuda(const Tensor& t, const char* op, const char* name) {
  if (t.defined() && t.device() != DeviceType::kCUDA) {
    throw RuntimeError(std::string("[") + op + "] " + name + " is on " + device_type_name(t.device()) +
                       ", expected a CUDA tensor");
  }
}

// ---------------------------------------------------------------------------------------------
// Elementwise launches
// ---------------------------------------------------------------------------------------------

// f(i) for i in [0, n), grid-stride (f a __device__ functor taken by value).
template <class F>
__global__ void map_kernel(F f, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    f(i);
  }
}

// Launches map_kernel on the process stream (nothing for n <= 0) and checks the launch.
template <class F>
void launch_map(const F& f, std::int64_t n, const char* op) {
  if (n <= 0) return;
  map_kernel<F><<<grid_for(n), 256, 0, stream()>>>(f, n);
  check_launch(op);
}

// ---------------------------------------------------------------------------------------------
// Reductions (blockDim.x must be a multiple of 32 and at most 1024)
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of v over the block, returned to every thread; `sh` is __shared__ float[32]. The order
// of additions is fixed by blockDim, so a launch configuration gives the same bits every run.
// Every thread of the block must call it (it synchronizes).
__device__ __forceinline__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  __syncthreads();  // a previous call's readers are done with sh
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  const int nw = static_cast<int>(blockDim.x >> 5);
  float s = 0.0f;
  for (int k = 0; k < nw; ++k) s += sh[k];
  return s;
}

// Two sums at once; `sh` is __shared__ float2[32].
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* sh) {
  a = warp_sum(a);
  b = warp_sum(b);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[wid] = make_float2(a, b);
  __syncthreads();
  const int nw = static_cast<int>(blockDim.x >> 5);
  float2 s = make_float2(0.0f, 0.0f);
  for (int k = 0; k < nw; ++k) {
    s.x += sh[k].x;
    s.y += sh[k].y;
  }
  return s;
}

// Threads for one block per row of width n: about 4 elements per thread, a whole number of warps,
// 32..1024 (rows wider than 4096 loop more per thread).
inline unsigned row_threads(std::int64_t n) {
  std::int64_t t = (n + 3) / 4;
  t = (t + 31) / 32 * 32;
  return static_cast<unsigned>(std::clamp<std::int64_t>(t, 32, 1024));
}

// Blocks for a grid-stride loop over `rows` rows (one block per row while rows fit).
inline unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>(std::clamp<std::int64_t>(rows, 1, std::int64_t{1} << 30));
}

// ---------------------------------------------------------------------------------------------
// exp as the CPU computes it (kernels/cpu/vec_math.h exp1): the same range reduction and
// polynomial with the same fmas, so sigmoid/SiLU agree with the CPU to the bit.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float cpu_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kExpHi = 88.72283935546875f;
  constexpr float kExpLo = -87.3365478515625f;
  if (isnan(x)) return x;
  if (x > kExpHi) return INFINITY;
  if (x < kExpLo) return 0.0f;
  const float n = rintf(__fmul_rn(x, kLog2e));
  float r = fmaf(-n, kLn2Hi, x);
  r = fmaf(-n, kLn2Lo, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  const float r2 = __fmul_rn(r, r);
  const float y = __fadd_rn(fmaf(p, r2, r), 1.0f);
  const float scale = __int_as_float((static_cast<int>(n) + 126) << 23);
  return __fmul_rn(__fmul_rn(y, scale), 2.0f);
}

// 1 / (1 + exp(-x)), as the CPU's vec::sigmoid.
__device__ __forceinline__ float cpu_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, cpu_exp(-x))); }

// ---------------------------------------------------------------------------------------------
// Deterministic column sums: dst[c] += Σ_r f(r, c) for r in [0, rows), c in [0, cols)
// ---------------------------------------------------------------------------------------------
//
// Pass 1: blocks of 32 columns x 8 row lanes; grid.y splits the rows into `splits` contiguous
// ranges. Each thread sums its rows in order, the 8 lanes are summed in order, and the block
// writes one partial per column (or, with one split, adds straight into dst).
// Pass 2: dst[c] += Σ_s partial[s, c] in split order.
// The workspace is splits x cols fp32 from ctx.alloc (label "workspace"), freed on return (the
// allocator's blocks are stream-ordered: every kernel runs on one stream). No float atomics, so
// the bits do not depend on scheduling.

constexpr int kColTile = 32;
constexpr int kColLanes = 8;

// Splits of the rows: one per 32 rows, at most 64 (0 for no rows).
inline std::int64_t column_sum_splits(std::int64_t rows) {
  if (rows <= 0) return 0;
  return std::clamp<std::int64_t>((rows + 31) / 32, 1, 64);
}

// Bytes column_sum_into allocates through ctx.alloc (before the allocator's rounding): 0 for one
// split, else splits x cols x 4.
inline std::size_t column_sum_workspace_bytes(std::int64_t rows, std::int64_t cols) {
  const std::int64_t s = column_sum_splits(rows);
  return s > 1 ? static_cast<std::size_t>(s * cols) * sizeof(float) : 0;
}

template <class F>
__global__ void column_sum_partial_kernel(F f, std::int64_t rows, std::int64_t cols, std::int64_t rows_per_split,
                                          float* __restrict__ partial, Out dst) {
  __shared__ float sh[kColLanes][kColTile + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_split;
  const std::int64_t r1 = min(rows, r0 + rows_per_split);
  float acc = 0.0f;
  if (c < cols) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) acc += f(r, c);
  }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kColLanes; ++k) s += sh[k][threadIdx.x];
    if (partial != nullptr) {
      partial[static_cast<std::int64_t>(blockIdx.y) * cols + c] = s;
    } else {
      dst.set(c, dst[c] + s);
    }
  }
}

template <int = 0>
__global__ void column_sum_finish_kernel(const float* __restrict__ partial, std::int64_t splits,
                                                std::int64_t cols, Out dst) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (std::int64_t k = 0; k < splits; ++k) s += partial[k * cols + c];
    dst.set(c, dst[c] + s);
  }
}

// dst[c] += Σ_r f(r, c) (f a __device__ functor taken by value: float operator()(int64 r, int64 c)).
// Launched on the process stream; reads only what f reads, so it may run before a kernel that
// overwrites f's inputs in place.
template <class F>
void column_sum_into(Out dst, F f, std::int64_t rows, std::int64_t cols, ExecContext& ctx, const char* op) {
  if (cols <= 0 || rows <= 0) return;
  const std::int64_t splits = column_sum_splits(rows);
  const std::int64_t per = (rows + splits - 1) / splits;
  const std::int64_t col_blocks = (cols + kColTile - 1) / kColTile;
  SCALELAB_CHECK(col_blocks <= 0x7fffffffLL, std::string("[") + op + "] too many columns for one launch");
  Tensor ws;
  float* partial = nullptr;
  if (splits > 1) {
    ws = Tensor::empty({splits, cols}, DType::kF32, *ctx.alloc, "workspace");
    partial = ws.f32();
  }
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
  const dim3 block(kColTile, kColLanes);
  column_sum_partial_kernel<F><<<grid, block, 0, stream()>>>(f, rows, cols, per, partial, dst);
  check_launch(op);
  if (splits > 1) {
    column_sum_finish_kernel<><<<grid_for(cols), 256, 0, stream()>>>(partial, splits, cols, dst);
    check_launch(op);
  }
}

}  // namespace scalelab::kernels::cuda
