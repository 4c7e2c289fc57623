#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace scalelab {
namespace {

// Reference: round a float to the nearest bf16 by exhaustive comparison of the two neighbours.
float bf16_reference(float f) {
  // Neighbours in double: the upper one of the largest finite bf16 is 2^128 (rounds to infinity).
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t lo = u & 0xffff0000u;
  float flo;
  std::memcpy(&flo, &lo, 4);
  int e;
  std::frexp(flo == 0 ? f : flo, &e);
  const double ulp = (lo & 0x7f800000u) == 0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, e - 8);
  const double dlo = static_cast<double>(flo), dhi = dlo + (f < 0 ? -ulp : ulp);
  const double x = f;
  const double d1 = std::fabs(x - dlo), d2 = std::fabs(dhi - x);
  double r = d1 < d2 ? dlo : (d2 < d1 ? dhi : (((lo >> 16) & 1u) ? dhi : dlo));
  return static_cast<float>(r);  // 2^128 becomes infinity
}

TEST(DType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isfinite(f)) continue;
    const float got = bf16_to_float(float_to_bf16(f));
    const float want = bf16_reference(f);
    if (std::isinf(want)) {
      EXPECT_TRUE(std::isinf(got));
    } else {
      EXPECT_EQ(got, want) << "input bits " << std::hex << u;
    }
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7; even is 1.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
}

TEST(DType, Fp16AllValuesRoundTrip) {
  // Every fp16 bit pattern converts to float and back unchanged (NaNs stay NaN).
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const fp16 h{static_cast<std::uint16_t>(b)};
    const float f = fp16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(float_to_fp16(f).bits, h.bits) << "pattern " << b;
  }
}

TEST(DType, Fp16RoundingMatchesHardwareConversion) {
  // Vector (F16C where present) and scalar paths agree on random floats across the whole range,
  // including subnormals, overflow to infinity and ties.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> src(100000);
  for (auto& f : src) {
    std::uint32_t u = bits(rng);
    u = (u & 0x80000000u) | (0x30000000u + (u % 0x18000000u));  // exponents around fp16's range
    std::memcpy(&f, &u, 4);
  }
  src.push_back(65520.0f);  // ties to infinity
  src.push_back(65519.0f);
  src.push_back(0x1p-25f);  // half the smallest subnormal: ties to zero (even)
  src.push_back(0x1.8p-24f);
  std::vector<fp16> vec(src.size());
  convert_f32_to_fp16(src.data(), vec.data(), src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(vec[i].bits, float_to_fp16(src[i]).bits) << src[i];
  }
  EXPECT_EQ(float_to_fp16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(float_to_fp16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(0x1p-25f).bits, 0);
  EXPECT_EQ(float_to_fp16(0x1.8p-24f).bits, 2);
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("bf16", "x"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float32", "x"), DType::kF32);
  EXPECT_THROW(parse_dtype("fp8", "--model-precision"), std::exception);
}

}  // namespace
}  // namespace scalelab
