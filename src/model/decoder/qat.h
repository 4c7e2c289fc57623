#pragma once
// Quantization-aware training (--qat 8da4w): the base product of a Linear of the decoder layers
// with torchao's Int8DynActInt4WeightQATLinear's fake quantization (kernels/qat.h):
//   forward:  xq = fq8(x) per token, wq = fq4(w) per group of G input columns; y = xq·wqᵀ (+ b)
//   backward: gx = dy·wq, gw = dyᵀ·xq (db += Σ dy); dx (+)= ste(gx; x), dw += ste(gw; w)
// xq and wq are recomputed in backward from x (which the model keeps for the Linear anyway) and w,
// so QAT keeps nothing more for backward: its cost in memory is transient — xq and wq during a
// forward product, and xq, wq, gx, gw during a backward one — which the memory plan measures
// (labels "qat activation", "qat weight", "qat input gradient", "qat weight gradient").
#include <memory>

#include "model/decoder/linear.h"

namespace scalelab {

class QatLinear final : public LinearQuant {
 public:
  explicit QatLinear(std::int64_t group_size) : group_(group_size) {}
  void forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, ExecContext& ctx) override;
  void backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                ExecContext& ctx, bool accumulate_dx) override;

 private:
  std::int64_t group_;
};

// The QAT form of the Linear over `weights` (the first names the module), or null when the layout
// has QAT off or it does not apply to that module (layout.qat_applies).
std::shared_ptr<LinearQuant> bind_qat(const ParamLayout& layout, const std::vector<std::string>& weights);

}  // namespace scalelab
