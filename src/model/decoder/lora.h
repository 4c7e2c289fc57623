#pragma once
// LoRA (--lora-rank): the adapter a Linear carries beside its frozen base weight. For each part
// of a (possibly fused) projection — q/k/v are one Linear, each its own adapter part — with
// lora_A [r, in], lora_B [n, r] and the part's output columns [col, col + n) of y:
//   forward:  z = x·Aᵀ [T, r];  y[:, col:col+n] += s·z·Bᵀ
//   backward: dB += s·dy[:, col:col+n]ᵀ·z;  dz = s·dy[:, col:col+n]·B;  dA += dzᵀ·x;  dx += dz·A
// Where it can (LinearAdapter's order), the adapter runs before the base product and writes
// y[:, col:col+n] = s·z·Bᵀ and dx = dz·A itself; the base then adds into them.
// with s = alpha/r (alpha/√r: rslora). When the parts share their input and their A's are adjacent
// (the layout stores a layer's lora_A's before its lora_B's), z of all parts is one GEMM
// x·[A_1; ...; A_P]ᵀ [T, P·r], and dA and dx one each: fewer, less skinny products over the same
// input. A training forward (ctx.train_step >= 0) keeps z ([T, P·r], or [T, r] per part: small
// beside the layer's activations) for its backward, as autograd keeps lora_A's output for peft;
// backward takes it when it was made in the same training micro-step (ctx.train_step) from an
// input of the same size, else recomputes it, and frees it. (Not by the input's address: under
// --fused-kernels backward rebuilds the norm output into a new buffer, bit for bit.) Activation
// checkpointing's recomputed forward makes it again; the memory plan measures it.
// While an AdaptersOff guard lives (on the calling thread) the forward adds nothing: the base
// model alone (DPO's reference log-probabilities under LoRA, train/dpo.h). Every product
// is kernels::gemm_ex on sub-matrices (leading dimensions), so it runs on every backend; the
// products that do not depend on each other go together through kernels::gemm_ex_group (the B
// products of the parts in forward; each part's dB and dz, then dA and dx, in backward), which
// the CPU runs concurrently, each product on one thread (dz has its own buffer for this).
//
// LoRA dropout (--lora-dropout P, peft's lora_dropout): while training (ctx.train_step >= 0) each
// part reads xd = dropout(x) instead of x — inverted dropout, kept elements scaled by 1/(1 − P) —
// with its own mask from the counter-based generator of kernels/dropout.h keyed by (--seed,
// micro-step, layer, site = the module's, 2..8), so y += s·B·A·dropout(x) as peft computes it
// (peft's masks come from torch's generator: the same statistics, other bits). Nothing is kept for
// backward: xd is regenerated from the key there, and dx += dropout(dz·A) applies the same mask.
// Transient: xd [T, in] per part in forward; xd and the masked input gradient [T, in] in backward
// (labels "lora dropout input", "lora dropout gradient"), which the memory plan measures. Outside
// training (evaluation, generation) and with P = 0 the computation is exactly the one without it.
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
    std::int64_t site = 2;  // dropout site of the module (lora_dropout_site)
  };
  LoraAdapter(std::vector<Part> parts, std::int64_t out_features, float scale, float dropout = 0.0f,
              std::int64_t layer = 0);
  void forward(Tensor& y, const Tensor& x, ExecContext& ctx, bool assign = false) override;
  void backward(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool assign_dx = false) override;
  // y is written whole when the parts' columns cover the projection (all of q/k/v, gate/up
  // targeted) and the adapters are on; dx whenever there is no dropout (dz·A covers every input
  // column).
  bool assigns_output(const ExecContext&) const override { return covers_ && !AdaptersOff::active(); }
  bool assigns_input_gradient(const ExecContext& ctx) const override { return !dropping(ctx); }
  const std::vector<Part>& parts() const { return parts_; }
  // Whether the parts' A's are stacked (one GEMM per product over the shared input when no dropout).
  bool stacks_parts() const { return stacked_; }

 private:
  std::vector<Part> parts_;
  std::int64_t out_;
  float scale_;
  float dropout_;
  std::int64_t layer_;
  bool stacked_ = false;  // every part's A (and dA) adjacent in memory, one rank and dtype: see stacked()
  bool covers_ = false;   // the parts' columns are [0, out) without a gap
  // z from the last training forward (stacked: one tensor; else one per part), its micro-step and
  // its input's element count, until backward takes it.
  std::vector<Tensor> saved_z_;
  std::int64_t saved_step_ = -1, saved_x_numel_ = 0;
  void keep_z(std::vector<Tensor> z, const Tensor& x, const ExecContext& ctx);
  // The kept z for this micro-step's input x (moved out; empty when there is none). Clears it.
  std::vector<Tensor> take_z(const Tensor& x, const ExecContext& ctx);
  bool dropping(const ExecContext& ctx) const { return dropout_ > 0.0f && ctx.train_step >= 0; }
  // The parts' products with the shared input in one GEMM each (z = x·[A_1; ...; A_P]ᵀ, dA and dx
  // likewise): more than one part, the A's stacked, and no dropout now (each part's dropout mask
  // gives it its own input).
  bool stacked(const ExecContext& ctx) const { return stacked_ && !dropping(ctx); }
  void forward_stacked(Tensor& y, const Tensor& x, ExecContext& ctx, bool assign);
  void backward_stacked(Tensor* dx, const Tensor& dy, const Tensor& x, ExecContext& ctx, bool assign_dx);
  // x itself, or dropout(x) for this part in a new tensor (training with P > 0).
  Tensor adapter_input(const Tensor& x, const Part& p, ExecContext& ctx) const;
};

// The dropout site of a LoRA module name (2..8; OPT's residual dropout uses 0 and 1): q_proj 2,
// k_proj 3, v_proj 4, o_proj/out_proj 5, gate_proj/fc1 6, up_proj 7, down_proj/fc2 8.
std::int64_t lora_dropout_site(const std::string& module_name);

// The LoRA adapter of the fused projection over `weights` ("<module>.weight" names, in order),
// or null when the layout has no adapter for any of them (layout.lora()).
std::shared_ptr<LinearAdapter> bind_lora(const ParamLayout& layout, const Tensor& params, const Tensor& grads,
                                         const std::vector<std::string>& weights);

}  // namespace scalelab
