#pragma once
// Shared checks of the op fronts (src/kernels/<family>.cpp): shape and dtype validation messages.
#include <string>

#include "core/context.h"
#include "core/error.h"
#include "core/tensor.h"

namespace scalelab::kernels {

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
