#pragma once
// QLoRA's frozen base projection over NF4 weights (--quantize-base; model/nf4.h): the QuantizedBase
// a Linear holds instead of a dense weight. The weight is never dequantized whole: for each part of
// the (possibly fused) projection — q/k/v are one Linear, each weight quantized on its own, as the
// references quantize each nn.Linear — rows [r0, r0 + n) are dequantized into one tile ("nf4
// tile": workspace in the memory plan) and multiplied at once (kernels::gemm_ex: sgemm on the
// CPU, cuBLASLt on CUDA). The tile has the activations' dtype when they are bf16 or fp16 (torchao
// and bitsandbytes dequantize to the compute dtype too: W = round(table[q]·absmax)), so on CUDA
// the product is one same-type bf16 GEMM on the tensor cores; fp32 otherwise. It holds at most
// kNf4TileElements elements on the CPU (OpenBLAS widens operands panel by panel anyway) and
// kNf4TileElementsCuda on CUDA (a whole 2048 x 2048 projection: GEMMs large enough to fill the GPU):
//   forward:  y[:, col + r0 : col + r0 + n] = x · tileᵀ        (then y += bias)
//   backward: dx (+)= dy[:, col + r0 : col + r0 + n] · tile    (the input gradient only: frozen)
#include <memory>
#include <string>
#include <vector>

#include "model/decoder/linear.h"
#include "model/nf4.h"

namespace scalelab {

// The largest tile: 2^18 elements on the CPU (1 MiB in fp32), 2^22 on CUDA (8 MiB in bf16); a
// tile holds whole rows, at least one. The meta device plans with its planned device's size.
inline constexpr std::int64_t kNf4TileElements = std::int64_t{1} << 18;
inline constexpr std::int64_t kNf4TileElementsCuda = std::int64_t{1} << 22;

class Nf4Linear final : public QuantizedBase {
 public:
  struct Part {
    kernels::Nf4View w;    // rows × in
    std::int64_t col = 0;  // first output column of this part
  };
  Nf4Linear(std::vector<Part> parts, std::int64_t in, std::int64_t out) : parts_(std::move(parts)), in_(in), out_(out) {}
  std::int64_t out_features() const override { return out_; }
  void forward(Tensor& y, const Tensor& x, const Tensor* bias, ExecContext& ctx) const override;
  void backward_input(Tensor& dx, const Tensor& dy, ExecContext& ctx, bool accumulate) const override;
  // Rows per tile for a weight of `cols` columns on `device` (the planned device on meta).
  static std::int64_t tile_rows(std::int64_t rows, std::int64_t cols, DeviceType device);
  // The tile's dtype for activations of dtype `act`: act when bf16/fp16, else fp32.
  static DType tile_dtype(DType act);

 private:
  std::vector<Part> parts_;
  std::int64_t in_, out_;
};

// The NF4 base of the fused projection over `weights`, or null when they are not quantized
// (layout.nf4() attached and every one ParamInfo::quantized; RuntimeError when only some are, or
// when no store is attached: a bug of the run's setup).
std::shared_ptr<const QuantizedBase> bind_nf4(const ParamLayout& layout, const std::vector<std::string>& weights);

}  // namespace scalelab
