#pragma once
// Normalization layers (norm family).
//
// RMSNorm (Llama):  y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps), per row of width H.
//   rmsnorm_forward saves rstd[rows] for backward.
//   rmsnorm_backward: dx assigned (or added when accumulate_dx), dw += (parameter gradient);
//                     an undefined dw (a frozen weight, --freeze) is skipped.
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps, ExecContext& ctx);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w,
                      ExecContext& ctx, bool accumulate_dx = false);

}  // namespace scalelab::kernels
