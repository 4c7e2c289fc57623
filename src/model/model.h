#pragma once
// The model interface the trainer drives: one micro-batch forward + loss + backward at a time,
// parameters and gradients in flat buffers laid out by ParamLayout.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/context.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace scalelab {

enum class AttentionImpl { kEager, kFlash };

// The engine's switches that change how a model computes (not what it computes).
struct ModelOptions {
  // Storage dtype of activations (and of the activation gradients); weights and parameter
  // gradients take the dtypes of the buffers the model is built over.
  DType activation_dtype = DType::kF32;
  AttentionImpl attention = AttentionImpl::kEager;
  bool fused_kernels = false;
  // Tokens per chunk of the fused linear + cross-entropy (--fused-loss-chunk); 0: the device's
  // default (kernels/fused.h).
  std::int64_t fused_loss_chunk = 0;
  bool activation_checkpointing = false;
  double dropout = 0.0;  // OPT only; the trainer resolves config vs --dropout
  std::uint64_t seed = 0;
};

struct Batch {
  Tensor inputs;   // int32 [B, S]
  Tensor targets;  // int32 [B, S]; kIgnoreIndex (-100) rows do not count in the loss
  std::int64_t batch = 0, seq = 0;
};

// Called as ranges [begin, end) of the flat gradient buffer become final during backward (in
// reverse layer order): the hook for overlapping gradient all-reduce with the rest of backward.
using GradReadyHook = std::function<void(std::int64_t begin, std::int64_t end)>;

struct KvCache;  // model/decoder/kv_cache.h

// A loss over the per-token log-probabilities of the targets (DPO, train/dpo.h): it reads logp
// (fp32 [B*S] on the model's device, 0 where the target is ignored), writes dL/dlogp into dlogp
// (the same shape; every scaling the gradients need included) and returns the loss value.
using LogprobLoss = std::function<double(const Tensor& logp, Tensor& dlogp, ExecContext& ctx)>;

class Model {
 public:
  virtual ~Model() = default;
  // Forward, mean cross-entropy over target tokens, and backward with the loss gradient scaled by
  // grad_scale (1 / grad-accum steps). Parameter gradients accumulate into the gradient buffer.
  // Returns the mean loss of this micro-batch.
  virtual double forward_backward(const Batch& batch, float grad_scale, ExecContext& ctx) = 0;
  // Forward only: mean loss; when logits_out is non-null it receives the logits [B*S, V] (in the
  // activation dtype).
  virtual double forward_loss(const Batch& batch, ExecContext& ctx, Tensor* logits_out = nullptr) = 0;
  // Inference with a KV cache (scalelab generate): runs the n tokens of b.inputs ([1, n]; targets
  // unused) at positions [cache.length, cache.length + n), appends their keys and values to the
  // cache, advances cache.length by n and returns their logits [n, vocab] (fp32), exactly what a
  // forward over the whole sequence gives at those positions. CPU, fp32 (model/decoder/kv_cache.h).
  // The default throws InvalidInput: a family without a cached path.
  virtual Tensor forward_cached(const Batch& b, KvCache& cache, ExecContext& ctx);
  // Forward only: logp (fp32 [B*S]) receives each target's log-probability log softmax(logits)[t],
  // 0 where the target is ignored. Not with --fused-kernels (the logits are needed whole).
  // The default throws InvalidInput: a family without it.
  virtual void forward_logprobs(Tensor& logp, const Batch& b, ExecContext& ctx);
  // Forward, a loss over the per-token log-probabilities, and backward (parameter gradients
  // accumulate as in forward_backward). Returns what `loss` returns. The default throws.
  virtual double forward_backward_logprobs(const Batch& b, const LogprobLoss& loss, ExecContext& ctx);
  virtual void set_grad_ready_hook(GradReadyHook hook) { hook_ = std::move(hook); }
  // Micro-steps counted by the model (e.g. to vary dropout masks); the trainer sets it.
  void set_step(std::int64_t step) { step_ = step; }

 protected:
  GradReadyHook hook_;
  std::int64_t step_ = 0;
};

// The dropout a run uses: --dropout when given (>= 0), else the config's for a family with
// dropout (model/family.h), else 0.
double resolve_dropout(const ModelConfig& c, double dropout_flag);
// Checks the switches against the model, the one place they are checked (make_plan_input and
// make_model call it): dropout in [0, 1) and only where the family has dropout, then the
// family's own check_options (e.g. OPT's --fused-kernels needs relu). Throws InvalidInput naming
// the flag.
void check_model_options(const ModelConfig& c, const ModelOptions& o);

// Builds the model for config.family over the given flat buffers (which must outlive it): the
// family descriptor's make_model (model/family.h), after check_model_options.
std::unique_ptr<Model> make_model(const ModelConfig& config, const ParamLayout& layout, Tensor& params, Tensor& grads,
                                  const ModelOptions& options);

}  // namespace scalelab
