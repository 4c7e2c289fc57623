// Fake quantization on CUDA (kernels/qat.h) with the CPU's arithmetic (kernels/qat_math.h, the same
// operations in the same order, so the same bits — for bf16/fp16 tensors torchao's arithmetic on
// that dtype, each rounding through CUDA's __float2bfloat16_rn / __float2half_rn, which round as
// core/dtype.h's host conversions do). One warp per run (an activation row or a
// weight group): its lanes read the run with a stride of 32 (coalesced), reduce the minimum and
// maximum with shuffles (min and max are exact, so the order cannot change them; the clamps
// against +0 in qat_math.h erase the sign of a zero), then each lane writes its elements.
// Compiled here; the bf16/fp16 arithmetic of qat_math.h (torchao's on that dtype) was compiled
// but has not run on a GPU yet (the qat selftest family compares it with the CPU bit for bit).
#include <cstdint>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rowops.cuh"
#include "kernels/kernel_common.h"
#include "kernels/qat_math.h"

namespace scalelab::kernels::cuda {

namespace {

constexpr unsigned kWarpsPerBlock = 8;

// kSte false: out = fq(x) per run. kSte true: out = ste(g; x) (or out += it when accumulate).
template <bool kSte>
__global__ void qat_runs_kernel(Out out, In x, In g, std::int64_t runs, std::int64_t n, bool per_token,
                                bool accumulate) {
  const unsigned lane = threadIdx.x & 31u;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); r < runs;
       r += warps) {  // r is the same for the whole warp: the shuffles below see every lane
    const std::int64_t base = r * n;
    float lo = x[base], hi = lo;
    for (std::int64_t i = lane; i < n; i += 32) {
      const float v = x[base + i];
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float l = __shfl_xor_sync(0xffffffffu, lo, o), h = __shfl_xor_sync(0xffffffffu, hi, o);
      lo = l < lo ? l : lo;
      hi = h > hi ? h : hi;
    }
    // x.t: the quantized tensor's dtype sets the arithmetic (qat_math.h), as on the CPU
    const qat::Affine a = per_token ? qat::per_token_params(lo, hi, x.t) : qat::group_params(lo, hi, x.t);
    for (std::int64_t i = lane; i < n; i += 32) {
      if constexpr (kSte) {
        const float v = qat::ste(g[base + i], x[base + i], a);
        out.set(base + i, accumulate ? __fadd_rn(out[base + i], v) : v);
      } else {
        out.set(base + i, qat::fake_quant(x[base + i], a));
      }
    }
  }
}

template <bool kSte>
void launch_runs(Out out, In x, In g, std::int64_t runs, std::int64_t n, bool per_token, bool accumulate,
                 const char* op) {
  if (runs <= 0) return;
  std::int64_t blocks = (runs + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;
  qat_runs_kernel<kSte><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream()>>>(out, x, g, runs, n,
                                                                                           per_token, accumulate);
  check_launch(op);
}

}  // namespace

void CudaBackend::fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1);
  launch_runs<false>(out_of(y), in_of(x), In{}, x.numel() / n, n, true, false, "fake_quant_per_token_forward");
}

void CudaBackend::fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate,
                                                ExecContext&) {
  const std::int64_t n = x.dim(x.rank() - 1);
  launch_runs<true>(out_of(dx), in_of(x), in_of(dy), x.numel() / n, n, true, accumulate,
                    "fake_quant_per_token_backward");
}

void CudaBackend::fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext&) {
  launch_runs<false>(out_of(wq), in_of(w), In{}, w.numel() / group, group, false, false, "fake_quant_group_forward");
}

void CudaBackend::fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                            ExecContext&) {
  launch_runs<true>(out_of(dw), in_of(w), in_of(g), w.numel() / group, group, false, true,
                    "fake_quant_group_backward");
}

}  // namespace scalelab::kernels::cuda
