#include "model/decoder/lora.h"

#include "core/error.h"
#include "kernels/matmul.h"

namespace scalelab {

namespace {

thread_local bool adapters_off = false;

// A [rows, cols] sub-matrix at column `col` of the row-major matrix t [rows, ld].
const std::uint8_t* at_col(const Tensor& t, std::int64_t col) {
  return static_cast<const std::uint8_t*>(t.raw()) + static_cast<std::size_t>(col) * dtype_size(t.dtype());
}

}  // namespace

AdaptersOff::AdaptersOff() : previous_(adapters_off) { adapters_off = true; }
AdaptersOff::~AdaptersOff() { adapters_off = previous_; }
bool AdaptersOff::active() { return adapters_off; }

void LoraAdapter::forward(Tensor& y, const Tensor& x, ExecContext& ctx) {
  if (AdaptersOff::active()) return;  // the base model alone (DPO's reference forward)
  const std::int64_t in = x.dim(x.rank() - 1), T = x.numel() / in;
  for (const Part& p : parts_) {
    const std::int64_t r = p.a.dim(0), n = p.b.dim(0);
    Tensor z = Tensor::empty({T, r}, DType::kF32, *ctx.alloc, "lora z");
    // z = x·Aᵀ
    kernels::gemm_ex(false, true, T, r, in, 1.0f, x.raw(), x.dtype(), in, p.a.raw(), p.a.dtype(), in, 0.0f, z.raw(),
                     DType::kF32, r, ctx);
    // y[:, col:col+n] += s·z·Bᵀ
    kernels::gemm_ex(false, true, T, n, r, scale_, z.raw(), DType::kF32, r, p.b.raw(), p.b.dtype(), r, 1.0f,
                     const_cast<std::uint8_t*>(at_col(y, p.col)), y.dtype(), out_, ctx);
  }
}

void LoraAdapter::backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx) {
  const std::int64_t in = x.dim(x.rank() - 1), T = x.numel() / in;
  for (Part& p : parts_) {
    const std::int64_t r = p.a.dim(0), n = p.b.dim(0);
    const std::uint8_t* dyp = at_col(dy, p.col);
    Tensor z = Tensor::empty({T, r}, DType::kF32, *ctx.alloc, "lora z");
    kernels::gemm_ex(false, true, T, r, in, 1.0f, x.raw(), x.dtype(), in, p.a.raw(), p.a.dtype(), in, 0.0f, z.raw(),
                     DType::kF32, r, ctx);
    // dB += s·dy_partᵀ·z  [n, r]
    if (p.db.defined()) {
      kernels::gemm_ex(true, false, n, r, T, scale_, dyp, dy.dtype(), out_, z.raw(), DType::kF32, r, 1.0f, p.db.raw(),
                       p.db.dtype(), r, ctx);
    }
    // dz = s·dy_part·B  [T, r] (written over z)
    kernels::gemm_ex(false, false, T, r, n, scale_, dyp, dy.dtype(), out_, p.b.raw(), p.b.dtype(), r, 0.0f, z.raw(),
                     DType::kF32, r, ctx);
    // dA += dzᵀ·x  [r, in]
    if (p.da.defined()) {
      kernels::gemm_ex(true, false, r, in, T, 1.0f, z.raw(), DType::kF32, r, x.raw(), x.dtype(), in, 1.0f, p.da.raw(),
                       p.da.dtype(), in, ctx);
    }
    // dx += dz·A  [T, in]
    if (dx != nullptr && dx->defined()) {
      kernels::gemm_ex(false, false, T, in, r, 1.0f, z.raw(), DType::kF32, r, p.a.raw(), p.a.dtype(), in, 1.0f,
                       dx->raw(), dx->dtype(), in, ctx);
    }
  }
}

std::shared_ptr<LinearAdapter> bind_lora(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                                         const std::vector<std::string>& weights) {
  if (!layout.lora().enabled()) return nullptr;
  std::vector<LoraAdapter::Part> parts;
  std::int64_t col = 0;
  for (const auto& w : weights) {
    const std::string module = w.substr(0, w.size() - 7);  // drop ".weight"
    const ParamInfo* a = layout.find(module + ".lora_A.weight");
    if (a != nullptr) {
      LoraAdapter::Part p;
      p.a = layout.view(params, *a);
      p.da = layout.grad_view(grads, a->name);
      p.b = layout.view(params, module + ".lora_B.weight");
      p.db = layout.grad_view(grads, module + ".lora_B.weight");
      p.col = col;
      parts.push_back(std::move(p));
    }
    col += layout.at(w).shape[0];
  }
  if (parts.empty()) return nullptr;
  return std::make_shared<LoraAdapter>(std::move(parts), col, static_cast<float>(layout.lora().scale()));
}

}  // namespace scalelab
