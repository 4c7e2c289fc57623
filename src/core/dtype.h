#pragma once
// Element types of tensors and exact conversions between them.
//
// bf16 and fp16 are stored as raw 16-bit patterns (struct bf16 / struct fp16). Conversions from
// float round to nearest, ties to even, as PyTorch and CUDA do; NaN stays NaN (quiet), overflow
// goes to infinity, fp16 subnormals are produced and read exactly.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace scalelab {

// kI32 holds token ids; the float types hold everything else.
enum class DType : std::uint8_t { kF32, kBF16, kF16, kI32 };

struct bf16 {
  std::uint16_t bits;
};
struct fp16 {
  std::uint16_t bits;
};

constexpr std::size_t dtype_size(DType t) { return (t == DType::kF32 || t == DType::kI32) ? 4 : 2; }
std::string_view dtype_name(DType t);  // "fp32", "bf16", "fp16", "int32"
// Parses "fp32"/"float32"/"f32", "bf16"/"bfloat16", "fp16"/"float16"/"f16"; throws InvalidInput.
DType parse_dtype(std::string_view name, std::string_view what);

inline bf16 float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}
inline float bf16_to_float(bf16 h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16); }

inline fp16 float_to_fp16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16{static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  if (a >= 0x477ff000u) return fp16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: value = m * 2^-24 with m < 1024.
    if (a < 0x33000000u) return fp16{static_cast<std::uint16_t>(sign)};  // below half the smallest
    const std::uint32_t e = a >> 23;                   // biased exponent, 102..112
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;              // 14..24
    std::uint32_t m = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) ++m;
    return fp16{static_cast<std::uint16_t>(sign | m)};
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  std::uint32_t r = a - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return fp16{static_cast<std::uint16_t>(sign | (r >> 13))};
}

inline float fp16_to_float(fp16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t e = (h.bits >> 10) & 0x1fu;
  const std::uint32_t m = h.bits & 0x3ffu;
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);
    // Subnormal: m * 2^-24, exact in float.
    return std::bit_cast<float>(sign) + (sign ? -1.0f : 1.0f) * static_cast<float>(m) * 0x1p-24f;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// Bulk conversions (vectorized where the CPU allows; bit-identical to the scalar ones above).
void convert_f32_to_bf16(const float* src, bf16* dst, std::size_t n);
void convert_bf16_to_f32(const bf16* src, float* dst, std::size_t n);
void convert_f32_to_fp16(const float* src, fp16* dst, std::size_t n);
void convert_fp16_to_f32(const fp16* src, float* dst, std::size_t n);
// Copies n elements between any two dtypes (same-dtype is a memcpy).
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);

}  // namespace scalelab
