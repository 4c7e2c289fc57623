// Fake quantization on the CPU (qat.h): the reference, one row (activations) or one group
// (weights) at a time through the fp32 row staging of stage.h.
#include "kernels/qat.h"

#include "core/parallel.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/qat_math.h"

namespace scalelab::kernels::cpu {

namespace {

qat::Affine row_params(const float* x, std::int64_t n) {
  float lo = x[0], hi = x[0];
  for (std::int64_t i = 1; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  return qat::per_token_params(lo, hi);
}

qat::Affine group_params(const float* w, std::int64_t n) {
  float lo = w[0], hi = w[0];
  for (std::int64_t i = 1; i < n; ++i) {
    lo = w[i] < lo ? w[i] : lo;
    hi = w[i] > hi ? w[i] : hi;
  }
  return qat::group_params(lo, hi);
}

}  // namespace

void CpuBackend::fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
  parallel_for(rows, row_grain(n), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * n), x.dtype(), n, 0);
      void* yp = elem(y.raw(), y.dtype(), r * n);
      float* yr = out_row(yp, y.dtype(), n, 1);
      const qat::Affine a = row_params(xr, n);
      for (std::int64_t i = 0; i < n; ++i) yr[i] = qat::fake_quant(xr[i], a);
      store_row(yr, yp, y.dtype(), n);
    }
  });
}

void CpuBackend::fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate,
                                               ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1), rows = x.numel() / n;
  parallel_for(rows, row_grain(n), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = load_row(elem(x.raw(), x.dtype(), r * n), x.dtype(), n, 0);
      const float* gr = load_row(elem(dy.raw(), dy.dtype(), r * n), dy.dtype(), n, 1);
      void* dp = elem(dx.raw(), dx.dtype(), r * n);
      float* dr = accumulate ? inout_row(dp, dx.dtype(), n, 2) : out_row(dp, dx.dtype(), n, 2);
      const qat::Affine a = row_params(xr, n);
      for (std::int64_t i = 0; i < n; ++i) {
        const float d = qat::ste(gr[i], xr[i], a);
        dr[i] = accumulate ? dr[i] + d : d;
      }
      store_row(dr, dp, dx.dtype(), n);
    }
  });
}

void CpuBackend::fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext&) {
  const std::int64_t n = w.dim(w.rank() - 1), rows = w.numel() / n;
  parallel_for(rows, row_grain(n), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* wr = load_row(elem(w.raw(), w.dtype(), r * n), w.dtype(), n, 0);
      void* qp = elem(wq.raw(), wq.dtype(), r * n);
      float* qr = out_row(qp, wq.dtype(), n, 1);
      for (std::int64_t g = 0; g < n; g += group) {
        const qat::Affine a = group_params(wr + g, group);
        for (std::int64_t i = g; i < g + group; ++i) qr[i] = qat::fake_quant(wr[i], a);
      }
      store_row(qr, qp, wq.dtype(), n);
    }
  });
}

void CpuBackend::fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                           ExecContext&) {
  const std::int64_t n = w.dim(w.rank() - 1), rows = w.numel() / n;
  parallel_for(rows, row_grain(n), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* wr = load_row(elem(w.raw(), w.dtype(), r * n), w.dtype(), n, 0);
      const float* gr = load_row(elem(g.raw(), g.dtype(), r * n), g.dtype(), n, 1);
      void* dp = elem(dw.raw(), dw.dtype(), r * n);
      float* dr = inout_row(dp, dw.dtype(), n, 2);
      for (std::int64_t c = 0; c < n; c += group) {
        const qat::Affine a = group_params(wr + c, group);
        for (std::int64_t i = c; i < c + group; ++i) dr[i] += qat::ste(gr[i], wr[i], a);
      }
      store_row(dr, dp, dw.dtype(), n);
    }
  });
}

}  // namespace scalelab::kernels::cpu
