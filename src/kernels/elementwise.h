#pragma once
// Elementwise helpers (elementwise family): residual adds.
//   add_(a, b):        a += b
//   add(out, a, b):    out = a + b
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void add_(Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase = Phase::kForward);
void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx, Phase phase = Phase::kForward);

}  // namespace scalelab::kernels
