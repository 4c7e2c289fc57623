#pragma once
// LayerNorm (norm family, OPT), as torch.nn.LayerNorm over the last dimension H:
//   y = (x − mean) · rstd · w + b,  mean = Σx / H,  rstd = 1 / sqrt(Σ(x − mean)² / H + eps)
// (biased variance; OPT uses eps = 1e-5). w and b may be undefined tensors when the layer has no
// elementwise affine (then w = 1, b = 0).
//   layernorm_forward saves mean[rows] and rstd[rows] for backward (and needs x kept).
//   layernorm_backward: dx assigned (or added when accumulate_dx), dw += Σ dy · xhat, db += Σ dy
//   (parameter gradients; dw / db may be null or undefined to skip them).
// The residual-fused form (h = x + delta, then the norm, in one pass) is in fused.h.
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps, ExecContext& ctx);
void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                        const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx = false);

}  // namespace scalelab::kernels
