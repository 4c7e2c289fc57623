#pragma once
// The meta backend: computes nothing. Each method makes exactly the workspace allocations of the
// CPU kernel — same sizes, labels and order of allocation and release, through ctx.alloc — and
// returns, so the memory plan can run the real model on the meta device and measure what it
// would allocate. The sizes come from the kernels' own *_workspace_bytes / *_workspace_blocks
// functions (one source of truth).
//
// Results that depend on values are stand-ins: losses sum to 0 and count every target (the plan
// assumes no target is kIgnoreIndex), count_target_tokens is the number of targets, the sum of
// squares is 0 and no gradient is non-finite.
#include "kernels/backend.h"

namespace scalelab::kernels::meta {

class MetaBackend final : public Backend {
 public:
  DeviceType device() const override;
  std::vector<std::string> ops() const override;  // every op: no composed fallback runs on meta

  // --- ops whose CPU kernels allocate nothing: they return at once
  void rmsnorm_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, float, ExecContext&) override {}
  void rmsnorm_backward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, ExecContext&,
                        bool) override {}
  void layernorm_forward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                         ExecContext&) override {}
  void layernorm_backward(Tensor&, Tensor*, Tensor*, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, ExecContext&, bool) override {}
  void add_(Tensor&, const Tensor&, ExecContext&) override {}
  void add(Tensor&, const Tensor&, const Tensor&, ExecContext&) override {}
  void swiglu_forward(Tensor&, const Tensor&, ExecContext&) override {}
  void swiglu_backward(Tensor&, const Tensor&, const Tensor&, ExecContext&) override {}
  void activation_forward(Tensor&, const Tensor&, Activation, ExecContext&) override {}
  void activation_backward(Tensor&, const Tensor&, const Tensor&, Activation, ExecContext&) override {}
  void bias_add_(Tensor&, const Tensor&, ExecContext&) override {}
  void embedding_forward(Tensor&, const Tensor&, const Tensor&, ExecContext&) override {}
  void embedding_backward(Tensor&, const Tensor&, const Tensor&, ExecContext&, std::int64_t) override {}
  void position_embedding_add_forward(Tensor&, const Tensor&, std::int64_t, std::int64_t, ExecContext&) override {}
  void position_embedding_backward(Tensor&, const Tensor&, std::int64_t, std::int64_t, ExecContext&) override {}
  void rope_forward(Tensor&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, const RopeTable&,
                    ExecContext&) override {}
  void rope_backward(Tensor&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, const RopeTable&,
                     ExecContext&) override {}
  void dropout_forward(Tensor&, float, const DropoutKey&, ExecContext&) override {}
  void dropout_backward(Tensor&, const Tensor&, float, const DropoutKey&, ExecContext&) override {}
  void fake_quant_per_token_forward(Tensor&, const Tensor&, ExecContext&) override {}
  void fake_quant_per_token_backward(Tensor&, const Tensor&, const Tensor&, bool, ExecContext&) override {}
  void fake_quant_group_forward(Tensor&, const Tensor&, std::int64_t, ExecContext&) override {}
  void fake_quant_group_backward(Tensor&, const Tensor&, const Tensor&, std::int64_t, ExecContext&) override {}
  void cross_entropy_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, float, ExecContext&) override {}
  void adamw_update(Tensor&, Tensor&, Tensor&, const Tensor&, const std::vector<ElementRange>&, const AdamWHyper&,
                    ExecContext&) override {}
  void scale_(Tensor&, float, ExecContext&) override {}
  void rmsnorm_residual_forward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                                ExecContext&) override {}
  void rmsnorm_residual_backward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 ExecContext&) override {}
  void rmsnorm_recompute(Tensor&, const Tensor&, const Tensor&, const Tensor&, ExecContext&) override {}
  void layernorm_residual_forward(Tensor&, Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, float, ExecContext&) override {}
  void layernorm_residual_backward(Tensor&, Tensor*, Tensor*, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, const Tensor&, ExecContext&) override {}
  void layernorm_recompute(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           ExecContext&) override {}
  void swiglu_backward_recompute(Tensor&, Tensor&, const Tensor&, const Tensor&, ExecContext&) override {}
  void bias_relu_forward(Tensor&, const Tensor&, const Tensor&, ExecContext&) override {}
  void bias_relu_backward(Tensor&, Tensor*, const Tensor&, const Tensor&, ExecContext&) override {}

  // --- ops that return a value: the stand-ins above
  LossSum cross_entropy_forward(Tensor&, const Tensor&, const Tensor& targets, ExecContext&) override {
    return {0.0, targets.numel()};
  }
  std::int64_t count_target_tokens(const Tensor& targets, ExecContext&) override { return targets.numel(); }
  double sum_of_squares(const Tensor&, ExecContext&) override { return 0.0; }
  bool has_non_finite(const Tensor&, ExecContext&) override { return false; }

  // --- ops whose CPU kernels allocate workspace (meta/backend.cpp): the same allocations
  void gemm_ex(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
               DType a_type, std::int64_t lda, const void* b, DType b_type, std::int64_t ldb, float beta, void* c,
               DType c_type, std::int64_t ldc, ExecContext& ctx) override;
  void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) override;
  void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w,
                       ExecContext& ctx, bool accumulate_dx) override;
  void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale,
                               ExecContext& ctx) override;
  void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
                                const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) override;
  void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale,
                               ExecContext& ctx) override;
  void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv,
                                const AttentionShape& s, float scale, ExecContext& ctx) override;
  void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu,
                                      const Tensor& wdown, ExecContext& ctx) override;
  LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& targets,
                                     float grad_scale_per_token, std::int64_t chunk_tokens, ExecContext& ctx) override;
  LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets,
                                             std::int64_t chunk_tokens, ExecContext& ctx) override;
};

}  // namespace scalelab::kernels::meta
