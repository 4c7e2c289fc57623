#include "model/decoder/qat.h"

#include "kernels/matmul.h"
#include "kernels/qat.h"

namespace scalelab {

void QatLinear::forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* b, ExecContext& ctx) {
  Tensor xq = Tensor::empty(x.shape(), x.dtype(), *ctx.alloc, "qat activation");
  kernels::fake_quant_per_token_forward(xq, x, ctx);
  Tensor wq = Tensor::empty(w.shape(), w.dtype(), *ctx.alloc, "qat weight");
  kernels::fake_quant_group_forward(wq, w, group_, ctx);
  kernels::linear_forward(y, xq, wq, b, ctx);
}

void QatLinear::backward(Tensor* dx, Tensor& dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         ExecContext& ctx, bool accumulate_dx) {
  const bool want_dx = dx != nullptr && dx->defined();
  Tensor xq = Tensor::empty(x.shape(), x.dtype(), *ctx.alloc, "qat activation");
  kernels::fake_quant_per_token_forward(xq, x, ctx);
  Tensor wq = Tensor::empty(w.shape(), w.dtype(), *ctx.alloc, "qat weight");
  kernels::fake_quant_group_forward(wq, w, group_, ctx);
  // gx = dy·wq and db += Σ dy through linear_backward (no weight gradient there: undefined dw).
  Tensor gx;
  if (want_dx) gx = Tensor::empty(x.shape(), dx->dtype(), *ctx.alloc, "qat input gradient");
  if (want_dx || db != nullptr) {
    Tensor no_dw;
    kernels::linear_backward(want_dx ? &gx : nullptr, no_dw, db, dy, xq, wq, ctx, false);
  }
  wq = Tensor();  // freed before gw is taken
  if (dw.defined()) {
    // gw = dyᵀ·xq [out, in], then dw += ste(gw; w).
    const std::int64_t in = w.dim(1), out = w.dim(0), T = x.numel() / in;
    Tensor gw = Tensor::empty(w.shape(), dw.dtype(), *ctx.alloc, "qat weight gradient");
    {
      ProfileScope prof(ctx, "matmul", Phase::kBackward);  // gemm_ex does not profile itself
      kernels::gemm_ex(true, false, out, in, T, 1.0f, dy.raw(), dy.dtype(), out, xq.raw(), xq.dtype(), in, 0.0f,
                       gw.raw(), gw.dtype(), in, ctx);
    }
    kernels::fake_quant_group_backward(dw, gw, w, group_, ctx);
  }
  xq = Tensor();
  if (want_dx) kernels::fake_quant_per_token_backward(*dx, gx, x, accumulate_dx, ctx);
}

std::shared_ptr<LinearQuant> bind_qat(const ParamLayout& layout, const std::vector<std::string>& weights) {
  if (!layout.qat_applies(weights.front())) return nullptr;
  return std::make_shared<QatLinear>(layout.qat().group_size);
}

}  // namespace scalelab
