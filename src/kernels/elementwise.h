#pragma once
// Elementwise helpers (elementwise family): residual adds and the row-broadcast bias add.
//   add_(a, b):        a += b
//   add(out, a, b):    out = a + b          (out may alias a or b)
//   bias_add_(y, b):   y[r, :] += b         (b[F], y[..., F]; the bias of a layer whose GEMM had none)
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void add_(Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase = Phase::kForward);
void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase = Phase::kForward);
void bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx, Phase phase = Phase::kForward);

}  // namespace scalelab::kernels
