#include "model/decoder/nf4_linear.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/nf4.h"

namespace scalelab {

namespace {

std::uint8_t* at_col(const Tensor& t, std::int64_t col) {
  return static_cast<std::uint8_t*>(t.raw()) + static_cast<std::size_t>(col) * dtype_size(t.dtype());
}

}  // namespace

std::int64_t Nf4Linear::tile_rows(std::int64_t rows, std::int64_t cols, DeviceType device) {
  const std::int64_t elements = device == DeviceType::kCUDA ? kNf4TileElementsCuda : kNf4TileElements;
  return std::clamp<std::int64_t>(elements / std::max<std::int64_t>(cols, 1), 1, rows);
}

DType Nf4Linear::tile_dtype(DType act) {
  return (act == DType::kBF16 || act == DType::kF16) ? act : DType::kF32;
}

void Nf4Linear::forward(Tensor& y, const Tensor& x, const Tensor* bias, ExecContext& ctx) const {
  const std::int64_t T = x.numel() / in_;
  for (const Part& p : parts_) {
    const std::int64_t step = tile_rows(p.w.rows, in_, ctx.options.run_device(x.device()));
    const DType tt = tile_dtype(x.dtype());
    Tensor tile = Tensor::empty({step, in_}, tt, *ctx.alloc, "nf4 tile");
    for (std::int64_t r0 = 0; r0 < p.w.rows; r0 += step) {
      const std::int64_t n = std::min(step, p.w.rows - r0);
      Tensor t = n == step ? tile : tile.slice(0, n * in_).view({n, in_});
      kernels::nf4_dequantize(t, p.w, r0, ctx);
      ProfileScope prof(ctx, "matmul", Phase::kForward);  // gemm_ex does not profile itself
      kernels::gemm_ex(false, true, T, n, in_, 1.0f, x.raw(), x.dtype(), in_, t.raw(), tt, in_, 0.0f,
                       at_col(y, p.col + r0), y.dtype(), out_, ctx);
    }
  }
  if (bias != nullptr) kernels::bias_add_(y, *bias, ctx);
}

void Nf4Linear::backward_input(Tensor& dx, const Tensor& dy, ExecContext& ctx, bool accumulate) const {
  const std::int64_t T = dy.numel() / out_;
  bool first = !accumulate;
  for (const Part& p : parts_) {
    const std::int64_t step = tile_rows(p.w.rows, in_, ctx.options.run_device(dy.device()));
    const DType tt = tile_dtype(dy.dtype());
    Tensor tile = Tensor::empty({step, in_}, tt, *ctx.alloc, "nf4 tile");
    for (std::int64_t r0 = 0; r0 < p.w.rows; r0 += step) {
      const std::int64_t n = std::min(step, p.w.rows - r0);
      Tensor t = n == step ? tile : tile.slice(0, n * in_).view({n, in_});
      kernels::nf4_dequantize(t, p.w, r0, ctx, Phase::kBackward);
      ProfileScope prof(ctx, "matmul", Phase::kBackward);  // gemm_ex does not profile itself
      kernels::gemm_ex(false, false, T, in_, n, 1.0f, at_col(dy, p.col + r0), dy.dtype(), out_, t.raw(), tt,
                       in_, first ? 0.0f : 1.0f, dx.raw(), dx.dtype(), in_, ctx);
      first = false;
    }
  }
}

std::shared_ptr<const QuantizedBase> bind_nf4(const ParamLayout& layout, const std::vector<std::string>& weights) {
  std::size_t quantized = 0;
  for (const auto& n : weights) quantized += layout.at(n).quantized ? 1 : 0;
  if (quantized == 0) return nullptr;
  SCALELAB_CHECK(quantized == weights.size(), "[nf4] " + weights.front() + " is quantized and others of its fused "
                                              "projection are not (a layout bug)");
  SCALELAB_CHECK(layout.nf4() != nullptr, "[nf4] the layout has quantized weights and no NF4 store is attached "
                                          "(ParamLayout::attach_nf4 before the model is built)");
  std::vector<Nf4Linear::Part> parts;
  std::int64_t col = 0;
  const std::int64_t in = layout.at(weights.front()).shape[1];
  for (const auto& n : weights) {
    Nf4Linear::Part p;
    p.w = layout.nf4()->view(n);
    p.col = col;
    col += p.w.rows;
    parts.push_back(p);
  }
  return std::make_shared<Nf4Linear>(std::move(parts), in, col);
}

}  // namespace scalelab
