#pragma once
// What every CUDA kernel file shares: error checks that throw typed errors, the stream and
// library handles of this process's GPU, launch geometry, and fp32 <-> storage-type conversion.
//
// One process drives one GPU (the launcher's local rank picks it); all kernels run on one stream,
// so the host never waits except where a value must be read (losses, norms).
#include <cublasLt.h>  // types only: the functions are called through cublaslt_dynload.h
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/context.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/cublaslt_dynload.h"
#include "kernels/cuda/runtime.h"

namespace scalelab::kernels::cuda {

// After a launch: turns a launch failure into an error naming the op.
inline void check_launch(const char* op) { check(cudaGetLastError(), op); }


// Blocks of `threads` covering n items, capped so that grid-stride loops take the rest.
inline unsigned grid_for(std::int64_t n, unsigned threads = 256) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 32) b = 65535LL * 32;
  return static_cast<unsigned>(b);
}

// Storage element <-> fp32 (compute is fp32 on every backend, as on the CPU).
template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
// Round to nearest even, as the CPU's conversion (core/dtype).
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Calls f.template operator()<T>() with T the CUDA storage type of dt (float, __nv_bfloat16, __half).
template <class F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::kF32: f.template operator()<float>(); return;
    case DType::kBF16: f.template operator()<__nv_bfloat16>(); return;
    case DType::kF16: f.template operator()<__half>(); return;
    default: throw RuntimeError(std::string("[") + op + "] unsupported dtype " + std::string(dtype_name(dt)));
  }
}

// ---------------------------------------------------------------------------------------------
// 16-byte packs: the memory-bound kernels' fast paths (one 128-bit load or store per thread and
// tensor; kernels fall back to their element-wise form when a tensor's dtype differs or a pointer
// or row length is not aligned to a pack).
// ---------------------------------------------------------------------------------------------

template <class T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, std::int64_t pack_index) {
  return reinterpret_cast<const Pack<T>*>(p)[pack_index];
}
template <class T>
__device__ __forceinline__ void store_pack(T* p, std::int64_t pack_index, const Pack<T>& x) {
  reinterpret_cast<Pack<T>*>(p)[pack_index] = x;
}

// Blocks of `threads` for a grid-stride loop over n packs: enough to fill every multiprocessor
// (32 blocks each), no more (the loop takes the rest).
unsigned pack_grid(std::int64_t n, unsigned threads = 256);

inline bool aligned_to(const void* p, std::size_t bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) % bytes) == 0;
}

// SCALELAB_CUDA_KERNELS=v1: the first (element-wise) versions of the kernels that have a packed or
// tiled fast path (adamw, swiglu, rmsnorm, rope), to compare the two on a GPU in one run.
bool cuda_kernels_v1();

}  // namespace scalelab::kernels::cuda
