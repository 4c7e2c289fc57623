// The meta backend's allocations: those of the CPU kernels (kernels/cpu/), from the same
// workspace functions, in the same order.
#include "kernels/meta/backend.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/attention.h"
#include "kernels/fused.h"
#include "kernels/matmul.h"

namespace scalelab::kernels::meta {

namespace {

// Workspace blocks taken in order and released in reverse, as a kernel's local tensors are.
class Workspace {
 public:
  explicit Workspace(ExecContext& ctx) : ctx_(ctx) {}
  ~Workspace() {
    while (!blocks_.empty()) blocks_.pop_back();
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void take(const Shape& shape, DType dtype, const char* label) {
    blocks_.push_back(Tensor::empty(shape, dtype, *ctx_.alloc, label));
  }
  // An fp32 block of `bytes` (a multiple of 4).
  void take_bytes(std::size_t bytes, const char* label) {
    take({static_cast<std::int64_t>(bytes / sizeof(float))}, DType::kF32, label);
  }

 private:
  ExecContext& ctx_;
  std::vector<Tensor> blocks_;
};

// The fp32 logits of the fused linear + cross-entropy, chunk by chunk: the blocks of
// fused_linear_cross_entropy_workspace_blocks, then, with low-precision tensors, each chunk's GEMMs
// (the logits; with gradients also dx_c = L·w and dw += Lᵀ·x_c), as cpu/fused_loss.cpp runs them.
LossSum linear_loss_chunks(Backend& be, const Tensor* dx, const Tensor* dw, const Tensor& x, const Tensor& w,
                           std::int64_t chunk_tokens, ExecContext& ctx) {
  const std::int64_t V = w.dim(0), H = w.dim(1), T = x.numel() / H;
  const bool backward = dx != nullptr;
  const bool has_dw = backward && dw->defined();  // undefined: a frozen head
  const DType dxt = backward ? dx->dtype() : DType::kF32, dwt = has_dw ? dw->dtype() : DType::kF32;
  const std::vector<std::size_t> blocks = fused_linear_cross_entropy_workspace_blocks(
      T, chunk_tokens, H, V, x.dtype(), w.dtype(), dxt, dwt, backward);
  Workspace ws(ctx);
  for (std::size_t b : blocks) ws.take_bytes(b, kFusedLossChunkLabel);
  if (blocks.size() > 1) {  // the low-precision path
    // The chunk's operands: fp32 on the CPU (the logits block and the converted input rows); on
    // CUDA the input rows and the gradient in place of the logits are in w's dtype, so that every
    // product is a same-type cuBLASLt GEMM (cuda/loss.cu fused_chunks).
    const DType ot = ctx.options.planned_device == DeviceType::kCUDA ? w.dtype() : DType::kF32;
    const std::int64_t chunk = fused_linear_cross_entropy_chunk(T, chunk_tokens, V);
    for (std::int64_t r0 = 0; r0 < T; r0 += chunk) {
      const std::int64_t c = std::min(chunk, T - r0);
      be.gemm_ex(false, true, c, V, H, 1.0f, nullptr, ot, H, nullptr, w.dtype(), H, 0.0f, nullptr, DType::kF32, V,
                 ctx);
      if (!backward) continue;
      be.gemm_ex(false, false, c, H, V, 1.0f, nullptr, ot, V, nullptr, w.dtype(), H, 0.0f, nullptr, dxt, H, ctx);
      if (has_dw) {
        be.gemm_ex(true, false, V, H, c, 1.0f, nullptr, ot, V, nullptr, ot, H, 1.0f, nullptr, dwt, H, ctx);
      }
    }
  }
  return {0.0, T};
}

}  // namespace

DeviceType MetaBackend::device() const { return DeviceType::kMeta; }

std::vector<std::string> MetaBackend::ops() const { return all_ops(); }

void MetaBackend::gemm_ex(bool, bool, std::int64_t m, std::int64_t n, std::int64_t k, float, const void*, DType at,
                          std::int64_t, const void*, DType bt, std::int64_t, float, void*, DType ct, std::int64_t,
                          ExecContext& ctx) {
  Workspace ws(ctx);
  const auto blocks = ctx.options.planned_device == DeviceType::kCUDA ? cuda_gemm_ex_workspace_blocks(m, n, k, at, bt, ct)
                                                                      : gemm_ex_workspace_blocks(m, n, k, at, bt, ct);
  for (std::size_t b : blocks) ws.take_bytes(b, "matmul workspace");
}

void MetaBackend::linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor*, ExecContext& ctx) {
  const std::int64_t out = w.dim(0), in = w.dim(1), tokens = x.numel() / in;
  gemm_ex(false, true, tokens, out, in, 1.0f, nullptr, x.dtype(), in, nullptr, w.dtype(), in, 0.0f, nullptr,
          y.dtype(), out, ctx);
}

void MetaBackend::linear_backward(Tensor* dx, Tensor& dw, Tensor*, const Tensor& dy, const Tensor& x, const Tensor& w,
                                  ExecContext& ctx, bool) {
  const std::int64_t out = w.dim(0), in = w.dim(1), tokens = x.numel() / in;
  if (dx != nullptr) {
    gemm_ex(false, false, tokens, in, out, 1.0f, nullptr, dy.dtype(), out, nullptr, w.dtype(), in, 0.0f, nullptr,
            dx->dtype(), in, ctx);
  }
  if (!dw.defined()) return;  // a frozen weight: no GEMM, no workspace
  gemm_ex(true, false, out, in, tokens, 1.0f, nullptr, dy.dtype(), out, nullptr, x.dtype(), in, 1.0f, nullptr,
          dw.dtype(), in, ctx);
}

void MetaBackend::attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s,
                                          float, ExecContext& ctx) {
  if (ctx.options.planned_device == DeviceType::kCUDA && cuda_eager_uses_cublaslt()) {
    Workspace ws(ctx);
    for (std::size_t b : attention_eager_cuda_workspace_blocks(s, false, qkv.dtype())) ws.take_bytes(b, "attention workspace");
    return;
  }
  const std::size_t bytes =
      attention_eager_forward_workspace_bytes(s, num_threads(), qkv.dtype(), probs.dtype(), out.dtype());
  Workspace ws(ctx);
  if (bytes > 0) ws.take_bytes(bytes, "attention workspace");
}

void MetaBackend::attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                           const AttentionShape& s, float, ExecContext& ctx) {
  Workspace ws(ctx);
  if (ctx.options.planned_device == DeviceType::kCUDA && cuda_eager_uses_cublaslt()) {
    for (std::size_t b : attention_eager_cuda_workspace_blocks(s, true, qkv.dtype())) ws.take_bytes(b, "attention workspace");
    return;
  }
  ws.take_bytes(attention_eager_backward_workspace_bytes(s, num_threads(), qkv.dtype(), dout.dtype(), probs.dtype(),
                                                         dqkv.dtype()),
                "attention workspace");
}

void MetaBackend::attention_flash_forward(Tensor&, Tensor&, const Tensor& qkv, const AttentionShape& s, float,
                                          ExecContext& ctx) {
  Workspace ws(ctx);
  ws.take_bytes(attention_flash_workspace_bytes(s, num_threads(), Phase::kForward, qkv.dtype()),
                "attention workspace");
}

void MetaBackend::attention_flash_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor& qkv,
                                           const AttentionShape& s, float, ExecContext& ctx) {
  Workspace ws(ctx);
  ws.take_bytes(attention_flash_workspace_bytes(s, num_threads(), Phase::kBackward, qkv.dtype()),
                "attention workspace");
}

void MetaBackend::swiglu_down_backward_recompute(Tensor&, Tensor& dwdown, const Tensor& dout, const Tensor&,
                                                 const Tensor& wdown, ExecContext& ctx) {
  const std::int64_t H = wdown.dim(0), I = wdown.dim(1), T = dout.numel() / H;
  Workspace ws(ctx);
  ws.take({T, I}, dout.dtype(), "mlp activation (recomputed)");
  gemm_ex(false, false, T, I, H, 1.0f, nullptr, dout.dtype(), H, nullptr, wdown.dtype(), I, 0.0f, nullptr,
          dout.dtype(), I, ctx);
  if (!dwdown.defined()) return;  // a frozen down_proj
  gemm_ex(true, false, H, I, T, 1.0f, nullptr, dout.dtype(), H, nullptr, dout.dtype(), I, 1.0f, nullptr,
          dwdown.dtype(), I, ctx);
}

LossSum MetaBackend::fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w,
                                                const Tensor&, float, std::int64_t chunk_tokens, ExecContext& ctx) {
  return linear_loss_chunks(*this, &dx, &dw, x, w, chunk_tokens, ctx);
}

LossSum MetaBackend::fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor&,
                                                        std::int64_t chunk_tokens, ExecContext& ctx) {
  return linear_loss_chunks(*this, nullptr, nullptr, x, w, chunk_tokens, ctx);
}

}  // namespace scalelab::kernels::meta
