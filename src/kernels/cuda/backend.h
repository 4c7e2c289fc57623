#pragma once
// The CUDA backend: every op of kernels/backend.h on an NVIDIA GPU. Each group of methods is
// defined in the file named above it (src/kernels/cuda/<family>.cu), mirroring src/kernels/cpu/.
#include "kernels/backend.h"

namespace scalelab::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  DeviceType device() const override;
  std::vector<std::string> ops() const override;  // backend.cu

  // --- matmul.cu
  void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, ExecContext& ctx) override;
  void linear_backward(Tensor* dx, Tensor& dw, Tensor* dbias, const Tensor& dy, const Tensor& x, const Tensor& w, ExecContext& ctx, bool accumulate_dx) override;
  void gemm_ex(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, DType a_type, std::int64_t lda, const void* b, DType b_type, std::int64_t ldb, float beta, void* c, DType c_type, std::int64_t ldc, ExecContext& ctx) override;

  // --- norm.cu
  void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, float eps, ExecContext& ctx) override;
  void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx) override;
  void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b, float eps, ExecContext& ctx) override;
  void layernorm_backward(Tensor& dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx, bool accumulate_dx) override;
  void rmsnorm_residual_forward(Tensor& h, Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& delta, const Tensor& w, float eps, ExecContext& ctx) override;
  void rmsnorm_residual_backward(Tensor& dh, Tensor& dw, const Tensor& dy, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx) override;
  void rmsnorm_recompute(Tensor& y, const Tensor& h, const Tensor& rstd, const Tensor& w, ExecContext& ctx) override;
  void layernorm_residual_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& delta, const Tensor& w, const Tensor& b, float eps, ExecContext& ctx) override;
  void layernorm_residual_backward(Tensor& dh, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& w, ExecContext& ctx) override;
  void layernorm_recompute(Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd, const Tensor& w, const Tensor& b, ExecContext& ctx) override;

  // --- elementwise.cu
  void add_(Tensor& a, const Tensor& b, ExecContext& ctx) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b, ExecContext& ctx) override;
  void swiglu_forward(Tensor& h, const Tensor& gu, ExecContext& ctx) override;
  void swiglu_backward(Tensor& dgu, const Tensor& dh, const Tensor& gu, ExecContext& ctx) override;
  void activation_forward(Tensor& y, const Tensor& x, Activation act, ExecContext& ctx) override;
  void activation_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Activation act, ExecContext& ctx) override;
  void bias_add_(Tensor& y, const Tensor& b, ExecContext& ctx) override;
  void swiglu_backward_recompute(Tensor& dgu, Tensor& act, const Tensor& dh, const Tensor& gu, ExecContext& ctx) override;
  void swiglu_down_backward_recompute(Tensor& dgu, Tensor& dwdown, const Tensor& dout, const Tensor& gu, const Tensor& wdown, ExecContext& ctx) override;
  void bias_relu_forward(Tensor& y, const Tensor& x, const Tensor& b, ExecContext& ctx) override;
  void bias_relu_backward(Tensor& dx, Tensor* db, const Tensor& dy, const Tensor& y, ExecContext& ctx) override;

  // --- embedding.cu
  void embedding_forward(Tensor& y, const Tensor& ids, const Tensor& table, ExecContext& ctx) override;
  void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids, ExecContext& ctx, std::int64_t skip_id) override;
  void position_embedding_add_forward(Tensor& y, const Tensor& table, std::int64_t seq, std::int64_t offset, ExecContext& ctx) override;
  void position_embedding_backward(Tensor& dtable, const Tensor& dy, std::int64_t seq, std::int64_t offset, ExecContext& ctx) override;

  // --- rope.cu
  void rope_forward(Tensor& x, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) override;
  void rope_backward(Tensor& dx, std::int64_t col, std::int64_t ld, std::int64_t n_heads, std::int64_t head_dim, std::int64_t seq_len, const RopeTable& table, ExecContext& ctx) override;

  // --- dropout.cu
  void dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx) override;
  void dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext& ctx) override;

  // --- qat.cu
  void fake_quant_per_token_forward(Tensor& y, const Tensor& x, ExecContext& ctx) override;
  void fake_quant_per_token_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate, ExecContext& ctx) override;
  void fake_quant_group_forward(Tensor& wq, const Tensor& w, std::int64_t group, ExecContext& ctx) override;
  void fake_quant_group_backward(Tensor& dw, const Tensor& g, const Tensor& w, std::int64_t group, ExecContext& ctx) override;

  // --- attention.cu
  void attention_eager_forward(Tensor& out, Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) override;
  void attention_eager_backward(Tensor& dqkv, const Tensor& dout, const Tensor& probs, const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) override;
  void attention_flash_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) override;
  void attention_flash_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s, float scale, ExecContext& ctx) override;

  // --- loss.cu
  LossSum cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets, ExecContext& ctx) override;
  void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets, float grad_scale, ExecContext& ctx) override;
  std::int64_t count_target_tokens(const Tensor& targets, ExecContext& ctx) override;
  LossSum fused_linear_cross_entropy(Tensor& dx, Tensor& dw, const Tensor& x, const Tensor& w, const Tensor& targets, float grad_scale_per_token, std::int64_t chunk_tokens, ExecContext& ctx) override;
  LossSum fused_linear_cross_entropy_forward(const Tensor& x, const Tensor& w, const Tensor& targets, std::int64_t chunk_tokens, ExecContext& ctx) override;

  // --- adamw.cu
  void adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads, const std::vector<ElementRange>& ranges, const AdamWHyper& hyper, ExecContext& ctx) override;
  double sum_of_squares(const Tensor& g, ExecContext& ctx) override;
  bool has_non_finite(const Tensor& g, ExecContext& ctx) override;
  void scale_(Tensor& g, float factor, ExecContext& ctx) override;
};

// Strided batched product on cuBLASLt (matmul.cu), for the eager attention's per-head GEMMs:
// for i in [0, batch): C_i = alpha·op(A_i)·op(B_i) + beta·C_i, with X_i = X + i·stride_x elements,
// row-major as gemm_ex. A and B of one type (fp32, bf16 or fp16), C of that type or fp32. No
// scratch (falls back to one product per item when cuBLASLt offers no batched algorithm).
void gemm_strided_batched(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
                          DType ab, std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                          std::int64_t stride_b, float beta, void* c, DType ct, std::int64_t ldc, std::int64_t stride_c,
                          std::int64_t batch);

}  // namespace scalelab::kernels::cuda
