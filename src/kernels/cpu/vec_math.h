#pragma once
// Vectorized float math for the CPU kernels: exp over AVX2 lanes (8 floats), with a scalar path
// that computes the same polynomial so results do not depend on where a row is split.
//
// Why hand-written: glibc's vector expf (libmvec) is only reachable under -ffast-math, which we do
// not want for the whole engine (it would also break NaN/inf handling in the loss). The method is
// the classic one: exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 (split in two
// constants for precision), exp(r) by a degree-6 polynomial on |r| <= ln2/2. Max error ~2 ulp.
#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SCALELAB_AVX2 1
#endif

namespace scalelab::vec {

namespace detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpHi = 88.72283935546875f;  // ln(FLT_MAX)
constexpr float kExpLo = -87.3365478515625f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
}  // namespace detail

// Scalar exp with the same algorithm as exp8 (bit-identical results per element).
inline float exp1(float x) {
  using namespace detail;
  if (std::isnan(x)) return x;
  if (x > kExpHi) return INFINITY;
  if (x < kExpLo) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kP0;
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  const float r2 = r * r;
  float y = std::fma(p, r2, r) + 1.0f;
  // 2^n applied as 2^(n-1) * 2 so that n = 128 (x just below the overflow bound) stays finite.
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 126) << 23;
  float scale;
  static_assert(sizeof(scale) == sizeof(bits));
  __builtin_memcpy(&scale, &bits, 4);
  return (y * scale) * 2.0f;
}

#ifdef SCALELAB_AVX2
inline __m256 exp8(__m256 x) {
  using namespace detail;
  const __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 hi_mask = _mm256_cmp_ps(x, _mm256_set1_ps(kExpHi), _CMP_GT_OQ);
  const __m256 lo_mask = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ);
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  y = _mm256_mul_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), hi_mask);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), lo_mask);
  return _mm256_blendv_ps(y, x, nan_mask);
}

inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
inline float hmax8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_max_ps(lo, hi);
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

// y[i] = exp(x[i] - shift); returns the sum of y (accumulated in 8 lanes, then the tail).
inline float exp_shift_sum(const float* x, float* y, std::int64_t n, float shift) {
  std::int64_t i = 0;
  float sum = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum8(acc);
#endif
  for (; i < n; ++i) {
    y[i] = exp1(x[i] - shift);
    sum += y[i];
  }
  return sum;
}

// Sum of exp(x[i] - shift) without storing.
inline float exp_shift_sum(const float* x, std::int64_t n, float shift) {
  std::int64_t i = 0;
  float sum = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  sum = hsum8(acc);
#endif
  for (; i < n; ++i) sum += exp1(x[i] - shift);
  return sum;
}

inline float max_of(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  float m = -INFINITY;
#ifdef SCALELAB_AVX2
  if (n >= 8) {
    __m256 acc = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
    m = hmax8(acc);
  }
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Logistic sigmoid 1 / (1 + exp(-x)), vectorized over n elements.
inline void sigmoid(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#ifdef SCALELAB_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(zero, _mm256_loadu_ps(x + i)));
    _mm256_storeu_ps(y + i, _mm256_div_ps(one, _mm256_add_ps(one, e)));
  }
#endif
  for (; i < n; ++i) y[i] = 1.0f / (1.0f + exp1(-x[i]));
}

}  // namespace scalelab::vec
