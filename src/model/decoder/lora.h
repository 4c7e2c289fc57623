#pragma once
// LoRA (--lora-rank): the adapter a Linear carries beside its frozen base weight. For each part
// of a (possibly fused) projection — q/k/v are one Linear, each its own adapter part — with
// lora_A [r, in], lora_B [n, r] and the part's output columns [col, col + n) of y:
//   forward:  z = x·Aᵀ [T, r];  y[:, col:col+n] += s·z·Bᵀ
//   backward: dB += s·dy[:, col:col+n]ᵀ·z;  dz = s·dy[:, col:col+n]·B;  dA += dzᵀ·x;  dx += dz·A
// with s = alpha/r (alpha/√r: rslora). z is recomputed in backward (a [T, r] GEMM) rather than
// kept, so activation checkpointing and the memory plan need nothing of their own.
// While an AdaptersOff guard lives (on the calling thread) the forward adds nothing: the base
// model alone (DPO's reference log-probabilities under LoRA, train/dpo.h). Every product
// is kernels::gemm_ex on sub-matrices (leading dimensions), so it runs on every backend.
#include <vector>

#include "model/decoder/linear.h"

namespace scalelab {

// The adapters off for the guard's lifetime, on this thread (nests).
class AdaptersOff {
 public:
  AdaptersOff();
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;
  static bool active();

 private:
  bool previous_;
};

class LoraAdapter final : public LinearAdapter {
 public:
  struct Part {
    Tensor a, da, b, db;  // lora_A [r, in], lora_B [n, r] (views of the flat buffers) and gradients
    std::int64_t col = 0;  // first output column of this part in the fused projection
  };
  LoraAdapter(std::vector<Part> parts, std::int64_t out_features, float scale)
      : parts_(std::move(parts)), out_(out_features), scale_(scale) {}
  void forward(Tensor& y, const Tensor& x, ExecContext& ctx) override;
  void backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx) override;
  const std::vector<Part>& parts() const { return parts_; }

 private:
  std::vector<Part> parts_;
  std::int64_t out_;
  float scale_;
};

// The LoRA adapter of the fused projection over `weights` ("<module>.weight" names, in order),
// or null when the layout has no adapter for any of them (layout.lora()).
std::shared_ptr<LinearAdapter> bind_lora(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                                         const std::vector<std::string>& weights);

}  // namespace scalelab
