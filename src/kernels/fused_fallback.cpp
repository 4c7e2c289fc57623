// The default fused ops of Backend: each composed of the basic ops of the same backend, so a new
// backend runs every model from its basic ops alone. Each computes the function its fused.h entry
// describes (the order of float operations differs, as between any two kernels); the composition
// needs the temporaries the fused kernel avoids, taken from ctx.alloc. The front has validated the
// arguments and opened the op's profile scope.
#include <algorithm>
#include <vector>

#include "kernels/backend.h"
#include "kernels/fused.h"

namespace scalelab::kernels {

namespace {

// `n` fp32 ones on the device of `alloc` (a row or column of a GEMM that sums or broadcasts).
Tensor ones(std::int64_t n, DeviceAllocator& alloc, const char* what) {
  Tensor t = Tensor::empty({n}, DType::kF32, alloc, what);
  const std::vector<float> host(static_cast<std::size_t>(n), 1.0f);
  t.copy_from_host(host.data());
  return t;
}

// y = rstd[r] · dy[r, i] · w[i] per row: rmsnorm_backward with a zero input (its mean term
// vanishes) and a scratch weight gradient (which stays 0). The one per-row scaling among the
// basic ops; w of width H.
void scale_rows(Backend& be, Tensor& y, const Tensor& dy, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  const std::int64_t H = w.numel();
  Tensor zeros = Tensor::zeros({dy.numel() / H, H}, dy.dtype(), *ctx.alloc, "fused fallback scratch");
  Tensor dw = Tensor::zeros({H}, DType::kF32, *ctx.alloc, "fused fallback scratch");
  be.rmsnorm_backward(y, dw, dy, zeros, rstd, w, ctx, /*accumulate_dx=*/false);
}

Tensor temporary_like(const Tensor& t, ExecContext& ctx) {
  return Tensor::empty(t.shape(), t.dtype(), *ctx.alloc, "fused fallback scratch");
}

// swiglu_backward where dgu may alias gu.
void swiglu_grad(Backend& be, Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) {
  Tensor out = dgu.raw() == gu.raw() ? temporary_like(dgu, ctx) : dgu;
  be.swiglu_backward(out, dh, gu, ctx);
  if (out.raw() != dgu.raw()) dgu.copy_from(out);
}

// Rows [r0, r0 + n) of a tensor viewed as [rows, width].
Tensor rows_of(const Tensor& t, std::int64_t width, std::int64_t r0, std::int64_t n) {
  return t.view({t.numel() / width, width}).slice(r0, r0 + n);
}

// Per chunk of tokens: logits L = x_c · wᵀ and the loss; with gradients (dx non-null) also
// L ← (softmax − onehot)·scale in place, dx_c = L · w and dw += Lᵀ · x_c. The [chunk, V] logits
// are the only large temporary.
LossSum linear_loss_chunks(Backend& be, Tensor* dx, Tensor* dw, const Tensor& x, const Tensor& w,
                           const Tensor& targets, float scale, std::int64_t chunk_tokens, ExecContext& ctx) {
  const std::int64_t V = w.dim(0), H = w.dim(1), T = x.numel() / H;
  const std::int64_t chunk = fused_linear_cross_entropy_chunk(T, chunk_tokens, V);
  Tensor logits = Tensor::empty({chunk, V}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  Tensor lse = Tensor::empty({chunk}, DType::kF32, *ctx.alloc, kFusedLossChunkLabel);
  LossSum total;
  for (std::int64_t r0 = 0; r0 < T; r0 += chunk) {
    const std::int64_t c = std::min(chunk, T - r0);
    Tensor L = logits.slice(0, c), l = lse.slice(0, c);
    const Tensor xc = rows_of(x, H, r0, c), tc = targets.view({T}).slice(r0, r0 + c);
    be.linear_forward(L, xc, w, nullptr, ctx);
    const LossSum part = be.cross_entropy_forward(l, L, tc, ctx);
    total.sum += part.sum;
    total.count += part.count;
    if (dx == nullptr) continue;
    Tensor dxc = rows_of(*dx, H, r0, c);
    be.cross_entropy_backward(L, L, l, tc, scale, ctx);
    be.linear_backward(&dxc, *dw, nullptr, L, xc, w, ctx, /*accumulate_dx=*/false);
  }
  return total;
}

}  // namespace

void Backend::rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                                       const Tensor& w, float eps, ExecContext& ctx) {
  add(h, x, delta, ctx);
  rmsnorm_forward(y, rstd, h, w, eps, ctx);
}

void Backend::rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h, const Tensor& rstd,
                                        const Tensor& w, ExecContext& ctx) {
  rmsnorm_backward(dh, dw, dy, h, rstd, w, ctx, /*accumulate_dx=*/true);
}

// y = h · rstd · w from the saved rstd (the norm's eps is not an argument, so rmsnorm_forward
// cannot rebuild it).
void Backend::rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  scale_rows(*this, y, h, rstd, w, ctx);
}

void Backend::layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                         const Tensor& delta, const Tensor& w, const Tensor& b, float eps,
                                         ExecContext& ctx) {
  add(h, x, delta, ctx);
  layernorm_forward(y, mean, rstd, h, w, b, eps, ctx);
}

void Backend::layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                          const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx) {
  layernorm_backward(dh, dw, db, dy, h, mean, rstd, w, ctx, /*accumulate_dx=*/true);
}

// y = (h − mean) · rstd · w + b from the saved statistics: h − mean by a rank-1 GEMM update
// (−mean ⊗ 1 added to a copy of h), the scaling by rstd and w as in rmsnorm_recompute, then b.
void Backend::layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd,
                                  const Tensor& w, const Tensor& b, ExecContext& ctx) {
  const std::int64_t H = h.dim(-1), rows = h.numel() / H;
  Tensor centered = Tensor::empty({rows, H}, DType::kF32, *ctx.alloc, "fused fallback scratch");
  centered.copy_from(h);
  const Tensor row_of_ones = ones(H, *ctx.alloc, "fused fallback scratch");
  gemm_ex(false, false, rows, H, 1, -1.0f, mean.raw(), DType::kF32, 1, row_of_ones.raw(), DType::kF32, H, 1.0f,
          centered.raw(), DType::kF32, H, ctx);
  scale_rows(*this, y, centered, rstd, w.defined() ? w : row_of_ones, ctx);
  if (b.defined()) bias_add_(y, b, ctx);
}

// act may alias dh and dgu may alias gu (fused.h); swiglu_forward and swiglu_backward promise no
// aliasing, so an aliased output is computed in a temporary and copied over once its input is read.
void Backend::swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu,
                                        ExecContext& ctx) {
  Tensor act_out = act.raw() == dh.raw() ? temporary_like(act, ctx) : act;
  swiglu_forward(act_out, gu, ctx);
  swiglu_grad(*this, dgu, dh, gu, ctx);
  if (act_out.raw() != act.raw()) act.copy_from(act_out);
}

// The profile books the GEMMs as matmul and the activation as activation, as the CPU kernel does.
void Backend::swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                             const Tensor& wdown, ExecContext& ctx) {
  const std::int64_t H = wdown.dim(0), I = wdown.dim(1), T = dout.numel() / H;
  Tensor act = Tensor::empty({T, I}, dout.dtype(), *ctx.alloc, "mlp activation (recomputed)");
  Tensor dact = Tensor::empty({T, I}, dout.dtype(), *ctx.alloc, "mlp activation (recomputed)");
  {
    ProfileScope prof(ctx, "activation", Phase::kBackward);
    swiglu_forward(act, gu, ctx);
  }
  {
    ProfileScope prof(ctx, "matmul", Phase::kBackward);
    linear_backward(&dact, dwdown, nullptr, dout, act, wdown, ctx, /*accumulate_dx=*/false);
  }
  ProfileScope prof(ctx, "activation", Phase::kBackward);
  swiglu_grad(*this, dgu, dact, gu, ctx);
}

// max(x + b, 0) through y (y may alias x). ReLU here maps NaN to 0 where the fused kernel keeps it.
void Backend::bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx) {
  if (y.raw() != x.raw()) y.copy_from(x);
  if (b.defined()) bias_add_(y, b, ctx);
  activation_forward(y, y, Activation::kReLU, ctx);
}

// dx = dy where y > 0 (relu' of the saved output); db += Σ_rows dx as 1ᵀ · dx.
void Backend::bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx) {
  activation_backward(dx, dy, y, Activation::kReLU, ctx);
  if (db == nullptr || !db->defined()) return;
  const std::int64_t F = y.dim(-1), rows = y.numel() / F;
  const Tensor column_of_ones = ones(rows, *ctx.alloc, "fused fallback scratch");
  gemm_ex(false, false, 1, F, rows, 1.0f, column_of_ones.raw(), DType::kF32, rows, dx.raw(), dx.dtype(), F, 1.0f,
          db->raw(), db->dtype(), F, ctx);
}

LossSum Backend::fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w,
                                            const Tensor& targets, float grad_scale_per_token,
                                            std::int64_t chunk_tokens, ExecContext& ctx) {
  return linear_loss_chunks(*this, &dx, &dw, x, w, targets, grad_scale_per_token, chunk_tokens, ctx);
}

LossSum Backend::fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                                    std::int64_t chunk_tokens, ExecContext& ctx) {
  return linear_loss_chunks(*this, nullptr, nullptr, x, w, targets, 0.0f, chunk_tokens, ctx);
}

}  // namespace scalelab::kernels
