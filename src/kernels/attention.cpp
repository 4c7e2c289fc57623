// Front of the attention family (attention.h): validation, profiling, dispatch.
#include "kernels/attention.h"

#include <cstdlib>
#include <string>

#include "kernels/backend.h"
#include "kernels/kernel_common.h"

namespace scalelab::kernels {

namespace {

// Eager saves the probabilities [B, nh, S, S] (any float dtype); flash saves the fp32 log-sum-exp
// [B, nh, S] and needs qkv and the output in one dtype.
void check(const Tensor& qkv, const Tensor& out, const Tensor& saved, const AttentionShape& s, bool flash,
           const char* op) {
  if (flash) {
    SCALELAB_CHECK(qkv.dtype() == out.dtype() && is_float_type(qkv.dtype()),
                   std::string("[") + op + "] qkv and output must share one float dtype");
    require_dtype(saved, DType::kF32, op, "lse");
    SCALELAB_CHECK(s.batch > 0 && s.seq > 0 && s.head_dim > 0, std::string("[") + op + "] empty shape");
  }
  SCALELAB_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0,
                 std::string("[") + op + "] n_kv_heads must divide n_heads");
  require_numel(qkv, s.batch * s.seq * s.qkv_width(), op, "qkv");
  require_numel(out, s.batch * s.seq * s.out_width(), op, "output");
  if (flash) {
    require_numel(saved, s.batch * s.n_heads * s.seq, op, "lse");
  } else {
    require_numel(saved, s.batch * s.n_heads * s.seq * s.seq, op, "probs");
  }
}

using ForwardMethod = void (Backend::*)(Tensor&, Tensor&, const Tensor&, const AttentionShape&, float, ExecContext&);

void forward(ForwardMethod method, const char* op, bool flash, Tensor& out, Tensor& saved, const Tensor& qkv,
             const AttentionShape& s, float scale, ExecContext& ctx) {
  ProfileScope prof(ctx, "attention", Phase::kForward);
  check(qkv, out, saved, s, flash, op);
  (backend_for(device_of(op, {&out, &saved, &qkv}), op).*method)(out, saved, qkv, s, scale, ctx);
}

}  // namespace

void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                             ExecContext& ctx) {
  forward(&Backend::attention_eager_forward, "attention_eager_forward", false, out, probs, qkv, s, scale, ctx);
}

void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                              const AttentionShape& s, float scale, ExecContext& ctx) {
  ProfileScope prof(ctx, "attention", Phase::kBackward);
  const char* op = "attention_eager_backward";
  check(qkv, dout, probs, s, /*flash=*/false, op);
  require_numel(dqkv, qkv.numel(), op, "qkv gradient");
  backend_for(device_of(op, {&dqkv, &dout, &probs, &qkv}), op)
      .attention_eager_backward(dqkv, dout, probs, qkv, s, scale, ctx);
}

void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale,
                             ExecContext& ctx) {
  forward(&Backend::attention_flash_forward, "attention_flash_forward", true, out, lse, qkv, s, scale, ctx);
}

void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                              const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) {
  ProfileScope prof(ctx, "attention", Phase::kBackward);
  const char* op = "attention_flash_backward";
  check(qkv, out, lse, s, /*flash=*/true, op);
  SCALELAB_CHECK(dout.dtype() == qkv.dtype() && dqkv.dtype() == qkv.dtype(),
                 "[attention_flash_backward] output and qkv gradients must share the dtype of qkv");
  require_numel(dout, out.numel(), op, "output gradient");
  require_numel(dqkv, qkv.numel(), op, "qkv gradient");
  backend_for(device_of(op, {&dqkv, &dout, &out, &lse, &qkv}), op)
      .attention_flash_backward(dqkv, dout, out, lse, qkv, s, scale, ctx);
}

bool cuda_eager_uses_cublaslt() {
  // Read once per process (each eager attention call asks, forward and backward, per layer). A bad
  // value throws from the initializer, so the static stays unset and every call throws again.
  static const bool lt = [] {
    const char* e = std::getenv("SCALELAB_CUDA_EAGER");
    if (e == nullptr || *e == '\0' || std::string(e) == "cublaslt") return true;
    if (std::string(e) == "fma") return false;
    throw InvalidInput(std::string("[SCALELAB_CUDA_EAGER] '") + e + "' is not one of: cublaslt (the default), fma");
  }();
  return lt;
}

std::vector<std::size_t> attention_eager_cuda_workspace_blocks(const AttentionShape& s, bool backward, DType act) {
  const auto n = static_cast<std::size_t>(s.n_kv_heads * s.seq * s.seq);
  if (!backward) return {n * sizeof(float)};
  return {n * sizeof(float), n * dtype_size(act)};
}

}  // namespace scalelab::kernels
