// Fake quantization on the CPU (qat.h): one row (activations) or one group (weights) at a time
// through the fp32 row staging of stage.h, rows split over the OpenMP threads.
//
// Each run (a row or a group) takes two passes over data that stays in L1: its minimum and
// maximum, then the quantize-dequantize (or the straight-through mask). Both passes are AVX2 over
// 8 lanes with a scalar tail. Bit-identical to the scalar steps of qat_math.h (and so to torchao):
//   - min and max are exact, so the lane order of the reduction cannot change them (the sign of a
//     zero can, but per_token_params / group_params clamp both against +0, which erases it);
//   - every other step is one IEEE fp32 operation per element, in qat_math.h's order, with the
//     same operand order where it matters: _mm256_max_ps(a, b) is exactly `a > b ? a : b` and
//     _mm256_min_ps(a, b) `a < b ? a : b` (the second operand on NaN or equal zeros), and
//     _mm256_round_ps(nearest) is rintf's round-half-to-even;
//   - no multiply feeds an add directly (round, the clamp or the mask sit between them), so the
//     compiler's FMA contraction has nothing to contract;
//   - for bf16 / fp16 tensors the STE's two roundings to the dtype (qat_math.h's `stored`) are
//     round-to-nearest-even over 8 lanes: bf16 by integer arithmetic on the bits (core/dtype.h's
//     float_to_bf16, NaN kept quiet), fp16 by F16C's conversion (the same as float_to_fp16); the
//     per-run scale and zero point come from the scalar steps.
// The zero point is added and subtracted even when it is 0 (weights): −0 + 0 = +0 changes the sign
// of a zero result exactly as torchao's `+ zero_point` does.
// QatKernels.VectorPathEqualsScalarSteps (tests/kernels/qat_test.cpp) checks every length 1..80
// and the tie / clamp / zero cases against qat_math.h element by element.
#include "kernels/qat.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/qat_math.h"

namespace scalelab::kernels::cpu {

namespace {

// The minimum and maximum of x[0, n), n >= 1 (qat_math.h's comparisons, lane by lane).
void min_max(const float* x, std::int64_t n, float& lo_out, float& hi_out) {
  float lo = x[0], hi = x[0];
  std::int64_t i = 1;
#ifdef SCALELAB_AVX2
  if (n >= 16) {
    __m256 lo0 = _mm256_loadu_ps(x), hi0 = lo0;
    __m256 lo1 = _mm256_loadu_ps(x + 8), hi1 = lo1;
    for (i = 16; i + 16 <= n; i += 16) {
      const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
      lo0 = _mm256_min_ps(a, lo0);
      hi0 = _mm256_max_ps(a, hi0);
      lo1 = _mm256_min_ps(b, lo1);
      hi1 = _mm256_max_ps(b, hi1);
    }
    // Across the lanes by halving (exact: min and max of non-NaN values in any order).
    __m128 l = _mm_min_ps(_mm256_castps256_ps128(_mm256_min_ps(lo1, lo0)), _mm256_extractf128_ps(_mm256_min_ps(lo1, lo0), 1));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(_mm256_max_ps(hi1, hi0)), _mm256_extractf128_ps(_mm256_max_ps(hi1, hi0), 1));
    l = _mm_min_ps(l, _mm_movehl_ps(l, l));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    lo = _mm_cvtss_f32(_mm_min_ss(l, _mm_shuffle_ps(l, l, 1)));
    hi = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
  }
#endif
  for (; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  lo_out = lo;
  hi_out = hi;
}

// y[i] = fq(x[i]) for a run with parameters a. y may alias x.
void fake_quant_run(float* y, const float* x, std::int64_t n, const qat::Affine& a) {
  std::int64_t i = 0;
#ifdef SCALELAB_AVX2
  const __m256 s = _mm256_set1_ps(a.scale), inv = _mm256_set1_ps(a.inv), zp = _mm256_set1_ps(a.zp);
  const __m256 qmin = _mm256_set1_ps(a.qmin), qmax = _mm256_set1_ps(a.qmax);
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_add_ps(q, zp);
    q = _mm256_min_ps(_mm256_max_ps(q, qmin), qmax);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_sub_ps(q, zp), s));
  }
#endif
  for (; i < n; ++i) y[i] = qat::fake_quant(x[i], a);
}

#ifdef SCALELAB_AVX2
// qat::stored over 8 lanes (core/dtype.h's conversions: to nearest even, NaN kept quiet).
template <DType kT>
inline __m256 stored8(__m256 v) {
  if constexpr (kT == DType::kF16) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else if constexpr (kT == DType::kBF16) {
    const __m256i u = _mm256_castps_si256(v), hi16 = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                                          _mm256_set1_epi32(0x7fff));
    const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(u, bias), hi16));
    const __m256 quiet = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, hi16), _mm256_set1_epi32(0x00400000)));
    return _mm256_blendv_ps(rounded, quiet, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  } else {
    return v;
  }
}
#endif

// d[i] = ste(g[i]; x[i]) (or d[i] += it when accumulate) for a run with parameters a, whose
// dtype is kT (a.t): the two products rounded to it (nothing for fp32).
template <DType kT>
void ste_run_t(float* d, const float* g, const float* x, std::int64_t n, const qat::Affine& a, bool accumulate) {
  std::int64_t i = 0;
#ifdef SCALELAB_AVX2
  const __m256 s = _mm256_set1_ps(a.scale), inv = _mm256_set1_ps(a.inv), zp = _mm256_set1_ps(a.zp);
  const __m256 qmin = _mm256_set1_ps(a.qmin), qmax = _mm256_set1_ps(a.qmax);
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_add_ps(q, zp);
    const __m256 inside = _mm256_and_ps(_mm256_cmp_ps(q, qmin, _CMP_GT_OQ), _mm256_cmp_ps(q, qmax, _CMP_LT_OQ));
    const __m256 gs = stored8<kT>(_mm256_mul_ps(_mm256_loadu_ps(g + i), s));
    const __m256 v = _mm256_and_ps(stored8<kT>(_mm256_mul_ps(gs, inv)), inside);
    _mm256_storeu_ps(d + i, accumulate ? _mm256_add_ps(_mm256_loadu_ps(d + i), v) : v);
  }
#endif
  for (; i < n; ++i) {
    const float v = qat::ste_t<kT>(g[i], x[i], a);
    d[i] = accumulate ? d[i] + v : v;
  }
}

// Runs f.template operator()<kT>() with kT = t, a compile-time constant: the dtype is tested once
// per call, not once per run (a weight group of 32 elements is too short to pay for it).
template <class F>
void with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBF16: f.template operator()<DType::kBF16>(); return;
    case DType::kF16: f.template operator()<DType::kF16>(); return;
    default: f.template operator()<DType::kF32>(); return;
  }
}

// Rows per thread chunk: at least 2^18 elements. A row or group costs about a nanosecond per
// element here, so a smaller loop finishes before a parallel region pays for itself — and on a
// shared machine every region waits for its slowest thread to be scheduled (measured on this
// project's loaded 2-core VM: at the default 2^16 grain the ~200 regions per llama-small step cost
// more than the kernels). Activations of a few hundred tokens run on one thread; the large
// weights split.
std::int64_t qat_grain(std::int64_t row_elements) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 18) / std::max<std::int64_t>(1, row_elements));
}

// The parameters of a run of a tensor of dtype kT (its values widened into x).
template <DType kT>
qat::Affine row_params(const float* x, std::int64_t n) {
  float lo, hi;
  min_max(x, n, lo, hi);
  return qat::per_token_params_t<kT>(lo, hi);
}

template <DType kT>
qat::Affine group_params(const float* w, std::int64_t n) {
  float lo, hi;
  min_max(w, n, lo, hi);
  return qat::group_params_t<kT>(lo, hi);
}

}  // namespace

void CpuBackend::fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
  with_dtype(x.dtype(), [&]<DType kT>() {
    parallel_for(rows, qat_grain(n), [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = load_row(elem(x.raw(), x.dtype(), r * n), x.dtype(), n, 0);
        void* yp = elem(y.raw(), y.dtype(), r * n);
        float* yr = out_row(yp, y.dtype(), n, 1);
        fake_quant_run(yr, xr, n, row_params<kT>(xr, n));
        store_row(yr, yp, y.dtype(), n);
      }
    });
  });
}

void CpuBackend::fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate,
                                               ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
  with_dtype(x.dtype(), [&]<DType kT>() {
    parallel_for(rows, qat_grain(n), [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = load_row(elem(x.raw(), x.dtype(), r * n), x.dtype(), n, 0);
        const float* gr = load_row(elem(dy.raw(), dy.dtype(), r * n), dy.dtype(), n, 1);
        void* dp = elem(dx.raw(), dx.dtype(), r * n);
        float* dr = accumulate ? inout_row(dp, dx.dtype(), n, 2) : out_row(dp, dx.dtype(), n, 2);
        ste_run_t<kT>(dr, gr, xr, n, row_params<kT>(xr, n), accumulate);
        store_row(dr, dp, dx.dtype(), n);
      }
    });
  });
}

void CpuBackend::fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext&) {
  const std::int64_t n = w.dim(w.rank() - 1), rows = w.numel() / n;
  with_dtype(w.dtype(), [&]<DType kT>() {
    parallel_for(rows, qat_grain(n), [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* wr = load_row(elem(w.raw(), w.dtype(), r * n), w.dtype(), n, 0);
        void* qp = elem(wq.raw(), wq.dtype(), r * n);
        float* qr = out_row(qp, wq.dtype(), n, 1);
        for (std::int64_t c = 0; c < n; c += group) {
          fake_quant_run(qr + c, wr + c, group, group_params<kT>(wr + c, group));
        }
        store_row(qr, qp, wq.dtype(), n);
      }
    });
  });
}

void CpuBackend::fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                           ExecContext&) {
  const std::int64_t n = w.dim(w.rank() - 1), rows = w.numel() / n;
  with_dtype(w.dtype(), [&]<DType kT>() {
    parallel_for(rows, qat_grain(n), [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* wr = load_row(elem(w.raw(), w.dtype(), r * n), w.dtype(), n, 0);
        const float* gr = load_row(elem(g.raw(), g.dtype(), r * n), g.dtype(), n, 1);
        void* dp = elem(dw.raw(), dw.dtype(), r * n);
        float* dr = inout_row(dp, dw.dtype(), n, 2);
        for (std::int64_t c = 0; c < n; c += group) {
          ste_run_t<kT>(dr + c, gr + c, wr + c, group, group_params<kT>(wr + c, group), /*accumulate=*/true);
        }
        store_row(dr, dp, dw.dtype(), n);
      }
    });
  });
}

}  // namespace scalelab::kernels::cpu
