#pragma once
// The CPU backend: every op of kernels/backend.h on the host, the readable reference and the
// oracle of every other backend. Each group of methods is defined in the file named above it
// (src/kernels/cpu/<file>.cpp). The fronts (src/kernels/<family>.cpp) have validated the
// arguments; what stays here are the checks that read tensor values (token ids, targets).
#include "kernels/backend.h"

namespace scalelab::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  DeviceType device() const override { return DeviceType::kCPU; }
  // Every op, fused ones included (none runs as a composed fallback).
  std::vector<std::string> ops() const override { return all_ops(); }

  // --- matmul.cpp
  void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) override;
  void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w,
                       ExecContext& ctx, bool accumulate_dx) override;
  void gemm_ex(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
               DType a_type, std::int64_t lda, const void* b, DType b_type, std::int64_t ldb, float beta, void* c,
               DType c_type, std::int64_t ldc, ExecContext& ctx) override;
  void gemm_ex_group(const std::vector<GemmExArgs>& products, ExecContext& ctx) override;

  // --- norm.cpp
  void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps, ExecContext& ctx) override;
  void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w,
                        ExecContext& ctx, bool accumulate_dx) override;

  // --- layernorm.cpp (plain and fused with the residual add)
  void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                         float eps, ExecContext& ctx) override;
  void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean,
                          const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx) override;
  void layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x,
                                  const Tensor& delta, const Tensor& w, const Tensor& b, float eps,
                                  ExecContext& ctx) override;
  void layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx) override;
  void layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                           const Tensor& b, ExecContext& ctx) override;

  // --- elementwise.cpp
  void add_(Tensor& a, const Tensor& b, ExecContext& ctx) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx) override;
  void bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx) override;

  // --- activation.cpp
  void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) override;
  void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) override;
  void activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext& ctx) override;
  void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act, ExecContext& ctx) override;

  // --- embedding.cpp
  void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) override;
  void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx,
                          std::int64_t skip_id) override;
  void position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset,
                                      ExecContext& ctx) override;
  void position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset,
                                   ExecContext& ctx) override;

  // --- rope.cpp
  void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                    std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) override;
  void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim,
                     std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) override;

  // --- dropout.cpp
  void dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx) override;
  void dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext& ctx) override;

  // --- qat.cpp
  void fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext& ctx) override;
  void fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate,
                                     ExecContext& ctx) override;
  void fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext& ctx) override;
  void fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group,
                                 ExecContext& ctx) override;

  // --- attention_eager.cpp, attention_flash.cpp
  void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                               ExecContext& ctx) override;
  void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                const AttentionShape& s, float scale, ExecContext& ctx) override;
  void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale,
                               ExecContext& ctx) override;
  void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) override;

  // --- loss.cpp
  LossSum cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets, ExecContext& ctx) override;
  void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                              float grad_scale, ExecContext& ctx) override;
  std::int64_t count_target_tokens(const Tensor& targets, ExecContext& ctx) override;

  // --- adamw.cpp
  void adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads, const std::vector<ElementRange>& ranges,
                    const AdamWHyper& hyper, ExecContext& ctx) override;
  double sum_of_squares(const Tensor& g, ExecContext& ctx) override;
  bool has_non_finite(const Tensor& g, ExecContext& ctx) override;
  void scale_(Tensor& g, float factor, ExecContext& ctx) override;

  // --- fused_norm.cpp
  void rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta,
                                const Tensor& w, float eps, ExecContext& ctx) override;
  void rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h, const Tensor& rstd,
                                 const Tensor& w, ExecContext& ctx) override;
  void rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx) override;

  // --- fused_activation.cpp
  void swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu,
                                 ExecContext& ctx) override;
  void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                      const Tensor& wdown, ExecContext& ctx) override;
  void bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx) override;
  void bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx) override;

  // --- fused_loss.cpp
  LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& targets,
                                     float grad_scale_per_token, std::int64_t chunk_tokens, ExecContext& ctx) override;
  LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                             std::int64_t chunk_tokens, ExecContext& ctx) override;
};

}  // namespace scalelab::kernels::cpu
