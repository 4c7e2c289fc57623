#pragma once
// Shared checks for op families: shape validation messages and the backend seam.
#include <string>

#include "core/context.h"
#include "core/error.h"
#include "core/tensor.h"

namespace scalelab::kernels {

// The backend seam: ops run on the device of their tensors. This build has the CPU backend; a
// tensor on another device gets a clear refusal instead of a crash.
inline void require_cpu(const Tensor& t, const char* op) {
  if (t.defined() && t.device() != DeviceType::kCPU) {
    throw RuntimeError(std::string("[") + op +
                       "] this build has no CUDA kernels for this op — run with --device cpu");
  }
}

inline void require_dtype(const Tensor& t, DType dt, const char* op, const char* name) {
  if (t.dtype() != dt) {
    throw RuntimeError(std::string("[") + op + "] " + name + " must be " + std::string(dtype_name(dt)) + ", got " +
                       std::string(dtype_name(t.dtype())));
  }
}

inline void require_numel(const Tensor& t, std::int64_t n, const char* op, const char* name) {
  if (t.numel() != n) {
    throw RuntimeError(std::string("[") + op + "] " + name + " has shape " + t.shape().str() + " (" +
                       std::to_string(t.numel()) + " elements), expected " + std::to_string(n));
  }
}

// Float-like storage types the kernels read and write; compute is always fp32.
inline bool is_float_type(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace scalelab::kernels
