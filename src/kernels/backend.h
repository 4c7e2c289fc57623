#pragma once
// The backend seam of the kernels: one object per device kind that implements the op families.
//
// Every op family has a backend-neutral front (src/kernels/<family>.h + .cpp): it validates the
// shapes and dtypes once, opens the profile scope, and calls the method of the same name on the
// backend of its tensors' device (backend_for). The backends:
//   kernels/cpu/   CpuBackend   the readable reference and the oracle of every other backend
//   kernels/meta/  MetaBackend  computes nothing; makes only the workspace allocations the kernel
//                               of the planned device would make (the memory plan runs on it)
//   kernels/cuda/  CudaBackend  built when CMake finds the CUDA toolkit (kernels/no_cuda/ else)
// A backend receives arguments the front has already validated, in the order of DESIGN.md
// (outputs, saved-for-backward, inputs, parameters, sizes, the context). Parameter gradients
// accumulate (+=), activation gradients assign (=), as each family's header says.
//
// Fused ops have a default implementation composed of the basic ops (Backend's own methods), so
// a new backend can start from the basic ops alone; supports(op, device) tells which ops a
// backend implements itself.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/context.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "kernels/loss.h"
#include "kernels/matmul.h"
#include "kernels/qat.h"
#include "kernels/rope.h"

namespace scalelab::kernels {

// A device whose backend is not in this build, or an op it does not implement.
class BackendUnavailable : public RuntimeError {
 public:
  BackendUnavailable(const std::string& op, DeviceType device, const std::string& why)
      : RuntimeError("[" + op + "] no " + device_type_name(device) + " kernel: " + why) {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device() const = 0;
  // The ops this backend implements itself (fused ops not listed run their composed fallback).
  virtual std::vector<std::string> ops() const = 0;

  // --- matmul: y = x·wᵀ (+ bias); see kernels/matmul.h
  virtual void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) = 0;
  virtual void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x,
                               const Tensor& w, ExecContext& ctx, bool accumulate_dx) = 0;
  // C[m,n] = alpha·op(A)·op(B) + beta·C, row-major, any float storage types, fp32 accumulation.
  virtual void gemm_ex(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                       const void* a, DType a_type, std::int64_t lda, const void* b, DType b_type, std::int64_t ldb,
                       float beta, void* c, DType c_type, std::int64_t ldc, ExecContext& ctx) = 0;
  // Independent products (kernels/matmul.h gemm_ex_group); by default one after another.
  virtual void gemm_ex_group(const std::vector<GemmExArgs>& products, ExecContext& ctx) {
    for (const GemmExArgs& g : products)
      gemm_ex(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, g.a, g.a_type, g.lda, g.b, g.b_type, g.ldb, g.beta, g.c,
              g.c_type, g.ldc, ctx);
  }

  // --- norm / layernorm
  virtual void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps,
                               ExecContext& ctx) = 0;
  virtual void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                const Tensor& w, ExecContext& ctx, bool accumulate_dx) = 0;
  virtual void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                                 const Tensor& b, float eps, ExecContext& ctx) = 0;
  virtual void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx,
                                  bool accumulate_dx) = 0;

  // --- elementwise / activation
  virtual void add_(Tensor& a, const Tensor& b, ExecContext& ctx) = 0;
  virtual void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx) = 0;
  virtual void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) = 0;
  virtual void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) = 0;
  virtual void activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext& ctx) = 0;
  virtual void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act,
                                   ExecContext& ctx) = 0;
  // Bias add over rows: y[r, :] += b (used by composed fallbacks).
  virtual void bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx) = 0;

  // --- embedding
  virtual void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) = 0;
  virtual void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx,
                                  std::int64_t skip_id) = 0;
  virtual void position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                              ExecContext& ctx) = 0;
  virtual void position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                           ExecContext& ctx) = 0;

  // --- rope (in place on columns [col, col + n_heads·head_dim) of rows of width ld)
  virtual void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads,
                            std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table,
                            ExecContext& ctx) = 0;
  virtual void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads,
                             std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table,
                             ExecContext& ctx) = 0;

  // --- dropout (counter-based masks: the same bits on every backend)
  virtual void dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx) = 0;
  virtual void dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key,
                                ExecContext& ctx) = 0;

  // --- qat: fake quantization as torchao's 8da4w (kernels/qat.h)
  virtual void fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext& ctx) = 0;
  virtual void fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate,
                                             ExecContext& ctx) = 0;
  virtual void fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext& ctx) = 0;
  virtual void fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                         ExecContext& ctx) = 0;

  // --- attention
  virtual void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s,
                                       float scale, ExecContext& ctx) = 0;
  virtual void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                        const AttentionShape& s, float scale, ExecContext& ctx) = 0;
  virtual void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s,
                                       float scale, ExecContext& ctx) = 0;
  virtual void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                        const Tensor& qkv, const AttentionShape& s, float scale,
                                        ExecContext& ctx) = 0;

  // --- loss. Device-side results: the sum and count are returned to the host (a synchronization).
  virtual LossSum cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets,
                                        ExecContext& ctx) = 0;
  virtual void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                      const Tensor& targets, float grad_scale, ExecContext& ctx) = 0;
  virtual std::int64_t count_target_tokens(const Tensor& targets, ExecContext& ctx) = 0;

  // --- optimizer
  virtual void adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads,
                            const std::vector<ElementRange>& ranges, const AdamWHyper& hyper, ExecContext& ctx) = 0;
  virtual double sum_of_squares(const Tensor& g, ExecContext& ctx) = 0;
  virtual bool has_non_finite(const Tensor& g, ExecContext& ctx) = 0;
  virtual void scale_(Tensor& g, float factor, ExecContext& ctx) = 0;

  // --- fused ops: the defaults compose the basic ops above (kernels/fused_fallback.cpp).
  virtual void rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                                        const Tensor& w, float eps, ExecContext& ctx);
  virtual void rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h,
                                         const Tensor& rstd, const Tensor& w, ExecContext& ctx);
  virtual void rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx);
  virtual void layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                          const Tensor& delta, const Tensor& w, const Tensor& b, float eps,
                                          ExecContext& ctx);
  virtual void layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                           const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                           ExecContext& ctx);
  virtual void layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& w, const Tensor& b, ExecContext& ctx);
  virtual void swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu,
                                         ExecContext& ctx);
  virtual void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                              const Tensor& wdown, ExecContext& ctx);
  virtual void bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx);
  virtual void bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx);
  virtual LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w,
                                             const Tensor& targets, float grad_scale_per_token,
                                             std::int64_t chunk_tokens, ExecContext& ctx);
  virtual LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                                     std::int64_t chunk_tokens, ExecContext& ctx);
};

// The backend of a device kind; throws BackendUnavailable naming `op` when that device's backend
// is not in this build (or, for CUDA, no usable GPU/driver is present).
Backend& backend_for(DeviceType device, const char* op);
// The common device of an op's tensors (undefined tensors are skipped); throws naming the op and
// both devices when they differ.
DeviceType device_of(const char* op, std::initializer_list<const Tensor*> tensors);
// Whether `device`'s backend implements `op` itself (false for ops it runs as a composed
// fallback, and for every op of a device that is not built).
bool supports(std::string_view op, DeviceType device);
// Every op name of the Backend interface, in declaration order.
const std::vector<std::string>& all_ops();

}  // namespace scalelab::kernels

namespace scalelab::kernels {
// Defined by src/kernels/cuda/ (CUDA builds) or src/kernels/no_cuda/: the CUDA backend, or
// nullptr with the reason.
Backend* cuda_backend_or_null(std::string* why);
}  // namespace scalelab::kernels
