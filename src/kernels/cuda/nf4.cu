// NF4 dequantization on CUDA (kernels/nf4.h), the CPU's arithmetic element for element
// (cpu/nf4.cpp): one thread per element of the tile, a table lookup times its block's absmax
// (rounded to the tile's dtype, bf16 or fp16, when the tile is not fp32),
// which is decoded in the references' order (torchao: q / factor + mean; bitsandbytes:
// map[q] · factor + mean) with IEEE fp32 division and no fused multiply-add, so the tile is
// bit-identical to the CPU's. The model multiplies the tile with cuBLAS (gemm_ex), one tile of
// rows at a time (model/decoder/nf4_linear.cpp).
#include <cstdint>

#include "kernels/nf4.h"
#include "kernels/cuda/common.cuh"

namespace scalelab::kernels::cuda {

namespace {

__constant__ float kTables[2][16];  // [0] torchao's, [1] bitsandbytes'  

template <class T>
__global__ void dequantize_kernel(T* out, const std::uint8_t* codes, const std::uint8_t* scalers,
                                  const float* factors, const float* dynamic_map, float mean, int torchao,
                                  std::int64_t e0, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = e0 + i, b = e / kNf4BlockSize, s = b / kNf4ScalerBlockSize;
    float absmax;
    if (torchao) {
      absmax = __fadd_rn(__fdiv_rn(static_cast<float>(static_cast<std::int8_t>(scalers[b])), factors[s]), mean);
    } else {
      absmax = __fadd_rn(__fmul_rn(dynamic_map[scalers[b]], factors[s]), mean);
    }
    const std::uint8_t byte = codes[e >> 1];
    const int code = (e & 1) ? (byte & 0x0F) : (byte >> 4);
    out[i] = from_f32<T>(__fmul_rn(kTables[torchao ? 0 : 1][code], absmax));  // bf16/fp16: nearest even
  }
}

}  // namespace

void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext&) {
  static const bool table_ready = [] {
    float tables[2][16];
    for (int i = 0; i < 16; ++i) {
      tables[0][i] = kNf4TableTorchao[i];
      tables[1][i] = kNf4Table[i];
    }
    // On the process stream (non-blocking: a plain cudaMemcpyToSymbol on the legacy stream would
    // not be ordered before the kernel), then waited for, as `tables` is a stack buffer.
    check(cudaMemcpyToSymbolAsync(kTables, tables, sizeof tables, 0, cudaMemcpyHostToDevice, stream()),
          "nf4_dequantize (NF4 tables)");
    check(cudaStreamSynchronize(stream()), "nf4_dequantize (NF4 tables)");
    return true;
  }();
  (void)table_ready;
  const std::int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float(out.dtype(), "nf4_dequantize", [&]<class T>() {
    dequantize_kernel<T><<<grid_for(n), 256, 0, stream()>>>(static_cast<T*>(out.raw()), w.codes, w.scalers,
                                                            w.factors, w.dynamic_map, w.mean,
                                                            w.flavor == Nf4Flavor::kTorchao ? 1 : 0, row0 * w.cols, n);
  });
  check_launch("nf4_dequantize");
}

}  // namespace scalelab::kernels::cuda
