#include "model/decoder/norm.h"

#include "kernels/elementwise.h"
#include "kernels/fused.h"
#include "kernels/layernorm.h"
#include "kernels/norm.h"

namespace scalelab {

using namespace kernels;

NormStats Norm::new_stats(std::int64_t T, const ActAlloc& a, const char* mean_label, const char* rstd_label) const {
  NormStats s;
  if (kind == NormKind::kLayerNorm) s.mean = a.f32({T}, mean_label);
  s.rstd = a.f32({T}, rstd_label);
  return s;
}

void Norm::forward(Tensor& y, NormStats& s, const Tensor& x, ExecContext& ctx) const {
  if (kind == NormKind::kRMSNorm) {
    rmsnorm_forward(y, s.rstd, x, w, eps, ctx);
  } else {
    layernorm_forward(y, s.mean, s.rstd, x, w, b, eps, ctx);
  }
}

void Norm::residual_forward(Tensor& h, Tensor& y, NormStats& s, const Tensor& base, bool fused,
                            ExecContext& ctx) const {
  if (!fused) {
    add_(h, base, ctx);
    forward(y, s, h, ctx);
  } else if (kind == NormKind::kRMSNorm) {
    rmsnorm_residual_forward(h, y, s.rstd, base, h, w, eps, ctx);
  } else {
    layernorm_residual_forward(h, y, s.mean, s.rstd, base, h, w, b, eps, ctx);
  }
}

void Norm::recompute(Tensor& y, const Tensor& x, const NormStats& s, ExecContext& ctx) const {
  if (kind == NormKind::kRMSNorm) {
    rmsnorm_recompute(y, x, s.rstd, w, ctx);
  } else {
    layernorm_recompute(y, x, s.mean, s.rstd, w, b, ctx);
  }
}

void Norm::backward(Tensor& dx, const Tensor& dy, const Tensor& x, const NormStats& s, ExecContext& ctx,
                    bool accumulate_dx) {
  if (kind == NormKind::kRMSNorm) {
    rmsnorm_backward(dx, dw, dy, x, s.rstd, w, ctx, accumulate_dx);
  } else {
    layernorm_backward(dx, dw.defined() ? &dw : nullptr, db.defined() ? &db : nullptr, dy, x, s.mean, s.rstd, w, ctx,
                       accumulate_dx);
  }
}

void Norm::residual_backward(Tensor& dh, const Tensor& dy, const Tensor& h, const NormStats& s, bool fused,
                             ExecContext& ctx) {
  if (!fused) {
    backward(dh, dy, h, s, ctx, /*accumulate_dx=*/true);
  } else if (kind == NormKind::kRMSNorm) {
    rmsnorm_residual_backward(dh, dw, dy, h, s.rstd, w, ctx);
  } else {
    layernorm_residual_backward(dh, dw.defined() ? &dw : nullptr, db.defined() ? &db : nullptr, dy, h, s.mean, s.rstd,
                                w, ctx);
  }
}

Norm bind_norm(NormKind kind, float eps, const ParamLayout& layout, const Tensor& params, const Tensor& grads,
               const std::string& weight, const std::string& bias) {
  Norm n;
  n.kind = kind;
  n.eps = eps;
  n.w = optional_view(layout, params, weight);
  n.dw = layout.grad_view(grads, weight);  // undefined when frozen (or absent)
  if (!bias.empty()) {
    n.b = optional_view(layout, params, bias);
    n.db = layout.grad_view(grads, bias);
  }
  return n;
}

}  // namespace scalelab
