#include "core/dtype.h"

#include <cstring>

#include "core/error.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define SCALELAB_HAVE_F16C 1
#endif

namespace scalelab {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kI32: return "int32";
  }
  return "?";
}

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "fp32" || name == "float32" || name == "f32" || name == "F32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::kBF16;
  if (name == "fp16" || name == "float16" || name == "f16" || name == "F16") return DType::kF16;
  throw InvalidInput("[" + std::string(what) + "] unknown dtype '" + std::string(name) +
                     "' — use fp32, bf16 or fp16");
}

void convert_f32_to_bf16(const float* src, bf16* dst, std::size_t n) {
  // The scalar form vectorizes well (integer ops only); keep one definition of the rounding.
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

void convert_bf16_to_f32(const bf16* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void convert_f32_to_fp16(const float* src, fp16* dst, std::size_t n) {
  std::size_t i = 0;
#ifdef SCALELAB_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}

void convert_fp16_to_f32(const fp16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
#ifdef SCALELAB_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}

void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  if (st == DType::kI32 || dt == DType::kI32) {
    throw RuntimeError("[dtype] cannot convert between int32 and a float type");
  }
  if (st == DType::kF32) {
    if (dt == DType::kBF16) return convert_f32_to_bf16(static_cast<const float*>(src), static_cast<bf16*>(dst), n);
    return convert_f32_to_fp16(static_cast<const float*>(src), static_cast<fp16*>(dst), n);
  }
  if (dt == DType::kF32) {
    if (st == DType::kBF16) return convert_bf16_to_f32(static_cast<const bf16*>(src), static_cast<float*>(dst), n);
    return convert_fp16_to_f32(static_cast<const fp16*>(src), static_cast<float*>(dst), n);
  }
  // bf16 <-> fp16: through float, element by element (exact: float holds both).
  for (std::size_t i = 0; i < n; ++i) {
    float f;
    convert(static_cast<const char*>(src) + i * 2, st, &f, DType::kF32, 1);
    convert(&f, DType::kF32, static_cast<char*>(dst) + i * 2, dt, 1);
  }
}

}  // namespace scalelab
