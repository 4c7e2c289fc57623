// NF4 dequantization on the CPU (nf4.h): the reference. Each element is one table lookup and one
// fp32 multiply by its block's absmax, which is decoded first in the references' order (torchao:
// q / factor + mean; bitsandbytes: map[q] · factor + mean).
#include "kernels/nf4.h"

#include "core/dtype.h"
#include "core/parallel.h"

namespace scalelab::kernels::cpu {

namespace {

// The absmax of 64-element block `b` (torchao's dequantize_scalers / bitsandbytes'
// dequantize_blockwise + offset, element by element).
inline float block_absmax(const Nf4View& w, std::int64_t b) {
  const std::int64_t s = b / kNf4ScalerBlockSize;
  if (w.flavor == Nf4Flavor::kTorchao) {
    const float q = static_cast<float>(static_cast<std::int8_t>(w.scalers[b]));
    return q / w.factors[s] + w.mean;
  }
  return mul_then_add(w.dynamic_map[w.scalers[b]], w.factors[s], w.mean);
}

}  // namespace

void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext&) {
  const std::int64_t rows = out.dim(0), cols = w.cols;
  const DType ot = out.dtype();
  auto* o = static_cast<std::uint8_t*>(out.raw());
  const std::size_t osize = dtype_size(ot);
  const float* table = nf4_values(w.flavor);
  const std::int64_t e0 = row0 * cols, n = rows * cols;
  // Chunks of whole 64-element blocks (a block's absmax decoded once per chunk it touches).
  const std::int64_t first_block = e0 / kNf4BlockSize, last_block = (e0 + n - 1) / kNf4BlockSize;
  parallel_for(last_block - first_block + 1, 64, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = first_block + b0; b < first_block + b1; ++b) {
      const float absmax = block_absmax(w, b);
      const std::int64_t begin = std::max(e0, b * kNf4BlockSize), end = std::min(e0 + n, (b + 1) * kNf4BlockSize);
      float vals[kNf4BlockSize];
      for (std::int64_t e = begin; e < end; ++e) {
        const std::uint8_t byte = w.codes[e >> 1];
        const int code = (e & 1) ? (byte & 0x0F) : (byte >> 4);
        vals[e - begin] = table[code] * absmax;
      }
      // fp32 copied as is; bf16/fp16 rounded to nearest even (core/dtype.h convert)
      convert(vals, DType::kF32, o + static_cast<std::size_t>(begin - e0) * osize, ot,
              static_cast<std::size_t>(end - begin));
    }
  });
}

}  // namespace scalelab::kernels::cpu
