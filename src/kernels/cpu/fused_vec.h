#pragma once
// Row reductions for the fused CPU kernels (norms, bias+activation), over AVX2 lanes with a scalar
// tail. Elementwise loops are left to the compiler (they vectorize at -O3); these are the
// reductions it will not vectorize without -ffast-math (float addition is not associative).
// Each sums in 8 lanes, then the lanes, then the tail: the order is fixed, so results are the
// same from run to run.
#include <cstdint>

#include "kernels/cpu/vec_math.h"

namespace scalelab::vec {

// h[i] = x[i] + d[i]; returns Σ h[i]². h may alias x or d.
inline float add_sumsq(float* h, const float* x, const float* d, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(d + i));
    _mm256_storeu_ps(h + i, v);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  s = hsum8(acc);
#endif
  for (; i < n; ++i) {
    const float v = x[i] + d[i];
    h[i] = v;
    s += v * v;
  }
  return s;
}

// Σ x[i]².
inline float sumsq(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  s = hsum8(acc);
#endif
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

// h[i] = x[i] + d[i]; returns Σ h[i]. h may alias x or d.
inline float add_sum(float* h, const float* x, const float* d, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(d + i));
    _mm256_storeu_ps(h + i, v);
    acc = _mm256_add_ps(acc, v);
  }
  s = hsum8(acc);
#endif
  for (; i < n; ++i) {
    const float v = x[i] + d[i];
    h[i] = v;
    s += v;
  }
  return s;
}

// Σ x[i].
inline float sum(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  s = hsum8(acc);
#endif
  for (; i < n; ++i) s += x[i];
  return s;
}

// Σ (x[i] − c)².
inline float sumsq_centered(const float* x, float c, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  const __m256 cv = _mm256_set1_ps(c);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), cv);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  s = hsum8(acc);
#endif
  for (; i < n; ++i) {
    const float v = x[i] - c;
    s += v * v;
  }
  return s;
}

// Σ a[i]·b[i].
inline float dot(const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#ifdef SCALELAB_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  s = hsum8(acc);
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace scalelab::vec
