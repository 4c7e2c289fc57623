// Front of LayerNorm (layernorm.h) and its residual-fused forms (fused.h): validation, profiling,
// dispatch.
#include "kernels/layernorm.h"

#include "kernels/backend.h"
#include "kernels/fused.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

// Rows of width H = x.dim(-1): the statistics and the optional affine parameters.
std::int64_t check_stats(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w, const Tensor* b,
                         const char* op) {
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  if (w.defined()) require_numel(w, H, op, "weight");
  if (b != nullptr && b->defined()) require_numel(*b, H, op, "bias");
  return rows;
}

void check_forward(Tensor* h, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                   const Tensor* delta, const Tensor& w, const Tensor& b, const char* op) {
  require_dtype(mean, DType::kF32, op, "mean");
  require_dtype(rstd, DType::kF32, op, "rstd");
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  require_numel(y, rows * H, op, "output");
  check_stats(x, mean, rstd, w, &b, op);
  if (delta != nullptr) {
    require_numel(*delta, rows * H, op, "residual delta");
    require_numel(*h, rows * H, op, "residual output");
  }
}

void check_backward(const Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                    const Tensor& rstd, const Tensor& w, const char* op) {
  const std::int64_t H = x.dim(-1), rows = x.numel() / H;
  require_numel(dx, rows * H, op, "input gradient");
  require_numel(dy, rows * H, op, "output gradient");
  check_stats(x, mean, rstd, w, nullptr, op);
  if (dw != nullptr && dw->defined()) require_numel(*dw, H, op, "weight gradient");
  if (db != nullptr && db->defined()) require_numel(*db, H, op, "bias gradient");
}

}  // namespace

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       float eps, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  const char* op = "layernorm_forward";
  check_forward(nullptr, y, mean, rstd, x, nullptr, w, b, op);
  backend_for(device_of(op, {&y, &mean, &rstd, &x, &w, &b}), op).layernorm_forward(y, mean, rstd, x, w, b, eps, ctx);
}

void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                        const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "layernorm_backward";
  check_backward(dx, dw, db, dy, x, mean, rstd, w, op);
  backend_for(device_of(op, {&dx, dw, db, &dy, &x, &mean, &rstd, &w}), op)
      .layernorm_backward(dx, dw, db, dy, x, mean, rstd, w, ctx, accumulate_dx);
}

void layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                const Tensor& delta, const Tensor& w, const Tensor& b, float eps, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kForward);
  const char* op = "layernorm_residual_forward";
  check_forward(&h, y, mean, rstd, x, &delta, w, b, op);
  backend_for(device_of(op, {&h, &y, &mean, &rstd, &x, &delta, &w, &b}), op)
      .layernorm_residual_forward(h, y, mean, rstd, x, delta, w, b, eps, ctx);
}

void layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "layernorm_residual_backward";
  check_backward(dh, dw, db, dy, h, mean, rstd, w, op);
  backend_for(device_of(op, {&dh, dw, db, &dy, &h, &mean, &rstd, &w}), op)
      .layernorm_residual_backward(dh, dw, db, dy, h, mean, rstd, w, ctx);
}

void layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         const Tensor& b, ExecContext& ctx) {
  ProfileScope prof(ctx, "norm", Phase::kBackward);
  const char* op = "layernorm_recompute";
  const std::int64_t rows = check_stats(h, mean, rstd, w, &b, op);
  require_numel(y, rows * h.dim(-1), op, "output");
  backend_for(device_of(op, {&y, &h, &mean, &rstd, &w, &b}), op).layernorm_recompute(y, h, mean, rstd, w, b, ctx);
}

}  // namespace scalelab::kernels
