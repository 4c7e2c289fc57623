#pragma once
// Norm + residual: RMSNorm (Llama, Qwen2) or LayerNorm (OPT) over views of the flat buffers, with
// the residual add fused into the norm that follows it (--fused-kernels) or done apart, and the
// rebuild of a dropped norm output from its saved statistics.
#include "model/decoder/linear.h"

namespace scalelab {

enum class NormKind { kRMSNorm, kLayerNorm };

// Per-row statistics kept for backward ([T], fp32): LayerNorm's mean and rstd, RMSNorm's rstd.
struct NormStats {
  Tensor mean, rstd;
};

struct Norm {
  NormKind kind = NormKind::kRMSNorm;
  Tensor w, dw, b, db;  // weight [H] and (LayerNorm) bias; undefined without elementwise affine
                        // (dw, db also undefined when frozen: the kernels skip those gradients)
  float eps = 1e-5f;

  // Allocates the statistics for T rows, labelled `<label> mean` / `<label> rstd`: LayerNorm mean
  // then rstd, RMSNorm rstd only (labels: "rmsnorm", "layernorm", "final norm").
  NormStats new_stats(std::int64_t T, const ActAlloc& a, const char* mean_label, const char* rstd_label) const;
  // y = norm(x), filling s.
  void forward(Tensor& y, NormStats& s, const Tensor& x, ExecContext& ctx) const;
  // h = base + h (h holds the delta on entry) and y = norm(h): one pass when fused, else add + norm.
  void residual_forward(Tensor& h, Tensor& y, NormStats& s, const Tensor& base, bool fused, ExecContext& ctx) const;
  // y = norm(x) again from the saved statistics (the output was dropped after forward).
  void recompute(Tensor& y, const Tensor& x, const NormStats& s, ExecContext& ctx) const;
  // dx = (or +=, when accumulate_dx) the input gradient; dw, db += the parameter gradients.
  void backward(Tensor& dx, const Tensor& dy, const Tensor& x, const NormStats& s, ExecContext& ctx,
                bool accumulate_dx = false);
  // The backward of residual_forward's norm: dh += the norm's input gradient (dh holds the
  // residual's gradient); the fused kernel when fused.
  void residual_backward(Tensor& dh, const Tensor& dy, const Tensor& h, const NormStats& s, bool fused,
                         ExecContext& ctx);
};

// A Norm over `weight` / `bias` (either may be absent from the layout: no elementwise affine).
Norm bind_norm(NormKind kind, float eps, const ParamLayout& layout, const Tensor& params, const Tensor& grads,
               const std::string& weight, const std::string& bias = "");

}  // namespace scalelab
