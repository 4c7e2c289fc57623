#pragma once
// NF4 dequantization (nf4 family): QLoRA's 4-bit NormalFloat weights, read tile by tile inside the
// GEMM path (model/decoder/nf4_linear.h), never dequantized whole.
//
// A quantized [rows, cols] weight W is stored over its flattened elements e = r·cols + c:
//   codes     one 4-bit index into the NF4 table per element, two per byte, element 2i in the high
//             nibble of byte i (torchao's and bitsandbytes' packing)
//   scalers   one byte per block of 64 elements: the block's absmax, itself quantized ("double
//             quantization") in blocks of 256 scalers with one fp32 factor each and one fp32 mean
//             per weight. The two references differ here (model/nf4.h):
//               torchao (Nf4Flavor::kTorchao): int8 q, absmax = q / factor[b] + mean
//               bitsandbytes (kBnb):           uint8 q into bnb's 256-entry dynamic map,
//                                              absmax = map[q] · factor[b] + mean
//   W[e] = table[code(e)] · absmax(e / 64) (the flavour's table), computed in fp32 in the references' order of operations,
//   so the dequantized values are bit-identical to torchao's get_original_weight() and to
//   bitsandbytes' dequantize_4bit().
//
//   nf4_dequantize: out[r − row0, c] = W[r, c] for r in [row0, row0 + out.dim(0)) (assigned);
//   out is fp32, bf16 or fp16 [n_rows, cols] on the weight's device (a 16-bit tile holds each fp32
//   value rounded to nearest even, as torchao and bitsandbytes dequantize to the compute dtype).
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

enum class Nf4Flavor : std::uint8_t { kTorchao, kBnb };

inline constexpr std::int64_t kNf4BlockSize = 64;         // elements per absmax
inline constexpr std::int64_t kNf4ScalerBlockSize = 256;  // absmaxes per second-level factor

// The 16 NF4 values (QLoRA's table) as fp32: bitsandbytes writes them to full precision
// (kNf4Table), torchao's NF4Tensor to four decimals (kNf4TableTorchao: -0.6962, ..., 0.7230).
extern const float kNf4Table[16];
extern const float kNf4TableTorchao[16];
inline const float* nf4_values(Nf4Flavor f) { return f == Nf4Flavor::kTorchao ? kNf4TableTorchao : kNf4Table; }

// a·b + c with two roundings, as the references compute bitsandbytes' absmax (a product, then the
// offset added): the volatile keeps the compiler from contracting it into a fused multiply-add.
inline float mul_then_add(float a, float b, float c) {
  volatile float p = a * b;
  return p + c;
}

// Device pointers into a quantized weight's storage (model/nf4.h owns it).
struct Nf4View {
  Nf4Flavor flavor = Nf4Flavor::kTorchao;
  std::int64_t rows = 0, cols = 0;
  const std::uint8_t* codes = nullptr;    // ceil(rows·cols / 2) bytes
  const std::uint8_t* scalers = nullptr;  // ceil(rows·cols / 64) bytes (int8 for torchao)
  const float* factors = nullptr;         // ceil(scalers / 256) fp32
  const float* dynamic_map = nullptr;     // bnb: 256 fp32 (its create_dynamic_map()); torchao: null
  float mean = 0.0f;                      // torchao's scaler_mean / bitsandbytes' offset
  DeviceType device = DeviceType::kCPU;
  std::int64_t numel() const { return rows * cols; }
};

// phase: the step phase the profile counts it in (QLoRA dequantizes the same tiles again in
// backward for the input gradient).
void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext& ctx,
                    Phase phase = Phase::kForward);

// The family's device kernels. The front dispatches on the tile's device itself rather than through
// a Backend method: one op that only QLoRA uses, kept out of the Backend interface every backend
// (and every other op family's build) depends on. cpu/nf4.cpp is the reference; cuda/nf4.cu the
// CUDA kernel (no_cuda/nf4.cpp: a clear refusal in builds without CUDA); meta allocates nothing.
namespace cpu {
void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext& ctx);
}
namespace cuda {
void nf4_dequantize(Tensor& out, const Nf4View& w, std::int64_t row0, ExecContext& ctx);
}

}  // namespace scalelab::kernels
