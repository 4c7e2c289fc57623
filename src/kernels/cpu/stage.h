#pragma once
// Row staging for low-precision storage: the CPU kernels compute in fp32 and read/write bf16 or
// fp16 tensors one row at a time through a small per-thread fp32 buffer. For fp32 tensors the
// pointers pass straight through, so the fp32 path pays nothing.
//
// Row buffers are kernel-internal scratch (a few rows of one hidden size per thread; on a GPU
// this is registers/shared memory) and are not counted by the device-memory allocator. Anything
// larger (GEMM panels, attention tiles) goes through the allocator as "workspace".
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace scalelab::kernels {

// Pointer to element i of a tensor buffer of dtype dt.
inline const void* elem(const void* base, DType dt, std::int64_t i) {
  return static_cast<const char*>(base) + i * static_cast<std::int64_t>(dtype_size(dt));
}
inline void* elem(void* base, DType dt, std::int64_t i) {
  return static_cast<char*>(base) + i * static_cast<std::int64_t>(dtype_size(dt));
}

// A per-thread fp32 row buffer of at least n floats (slot k lets one kernel hold several rows).
inline float* row_buffer(std::int64_t n, int slot = 0) {
  thread_local std::vector<float> bufs[4];
  auto& b = bufs[slot];
  if (static_cast<std::int64_t>(b.size()) < n) b.resize(static_cast<std::size_t>(n));
  return b.data();
}

// n fp32 values of the row at src: src itself when fp32, otherwise converted into row_buffer(slot).
inline const float* load_row(const void* src, DType dt, std::int64_t n, int slot) {
  if (dt == DType::kF32) return static_cast<const float*>(src);
  float* buf = row_buffer(n, slot);
  convert(src, dt, buf, DType::kF32, static_cast<std::size_t>(n));
  return buf;
}

// Where to compute an output row: dst itself when fp32, otherwise row_buffer(slot); finish with
// store_row().
inline float* out_row(void* dst, DType dt, std::int64_t n, int slot) {
  if (dt == DType::kF32) return static_cast<float*>(dst);
  return row_buffer(n, slot);
}
inline void store_row(const float* row, void* dst, DType dt, std::int64_t n) {
  if (dt == DType::kF32) return;  // computed in place
  convert(row, DType::kF32, dst, dt, static_cast<std::size_t>(n));
}

// Output row that also needs its current values (accumulation): loads then returns the buffer.
inline float* inout_row(void* dst, DType dt, std::int64_t n, int slot) {
  if (dt == DType::kF32) return static_cast<float*>(dst);
  float* buf = row_buffer(n, slot);
  convert(dst, dt, buf, DType::kF32, static_cast<std::size_t>(n));
  return buf;
}

}  // namespace scalelab::kernels
