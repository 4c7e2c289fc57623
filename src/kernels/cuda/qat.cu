// Fake quantization on CUDA (kernels/qat.h) with the CPU's arithmetic (kernels/qat_math.h, the same
// fp32 operations in the same order, so the same bits). One thread per activation row or weight
// group: each scans its elements for the minimum and maximum, then writes them. Simple, not tuned
// (a row per thread reads with a stride); compiled here, not yet run on a GPU.
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"
#include "kernels/qat_math.h"

namespace scalelab::kernels::cuda {

namespace {

// A run of n elements starting at `base` (a row or a group) and its int8/int4 parameters.
__device__ __forceinline__ qat::Affine run_params(const In& x, std::int64_t base, std::int64_t n, bool per_token) {
  float lo = x[base], hi = lo;
  for (std::int64_t i = 1; i < n; ++i) {
    const float v = x[base + i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  return per_token ? qat::per_token_params(lo, hi) : qat::group_params(lo, hi);
}

struct FakeQuantRun {
  Out y;
  In x;
  std::int64_t n;
  bool per_token;
  __device__ void operator()(std::int64_t r) const {
    const std::int64_t base = r * n;
    const qat::Affine a = run_params(x, base, n, per_token);
    for (std::int64_t i = 0; i < n; ++i) y.set(base + i, qat::fake_quant(x[base + i], a));
  }
};

struct SteRun {
  Out d;  // gradient written (or added to)
  In g, x;
  std::int64_t n;
  bool per_token, accumulate;
  __device__ void operator()(std::int64_t r) const {
    const std::int64_t base = r * n;
    const qat::Affine a = run_params(x, base, n, per_token);
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = qat::ste(g[base + i], x[base + i], a);
      d.set(base + i, accumulate ? __fadd_rn(d[base + i], v) : v);
    }
  }
};

}  // namespace

void CudaBackend::fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1);
  launch_map(FakeQuantRun{out_of(y), in_of(x), n, true}, x.numel() / n, "fake_quant_per_token_forward");
}

void CudaBackend::fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate,
                                                ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1);
  launch_map(SteRun{out_of(dx), in_of(dy), in_of(x), n, true, accumulate}, x.numel() / n,
             "fake_quant_per_token_backward");
}

void CudaBackend::fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext&) {
  launch_map(FakeQuantRun{out_of(wq), in_of(w), group, false}, w.numel() / group, "fake_quant_group_forward");
}

void CudaBackend::fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                            ExecContext&) {
  launch_map(SteRun{out_of(dw), in_of(g), in_of(w), group, false, true}, w.numel() / group,
             "fake_quant_group_backward");
}

}  // namespace scalelab::kernels::cuda
