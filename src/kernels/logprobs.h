#pragma once
// Per-token log-probabilities of the targets (loss family; DPO's sequence-level loss, train/dpo.h).
//
//   token_logprobs_forward: logp[r] = logits[r, target_r] − lse[r] (the log-probability of the
//     target; lse from cross_entropy_forward), 0 for ignored rows (kIgnoreIndex); fp32 [rows],
//     assigned.
//   token_logprobs_backward: its backward, dlogits = dlogp[r] · (onehot(target) − softmax(logits))
//     (dlogp fp32 [rows]: a loss's gradient with respect to each token's log-probability),
//     assigned; ignored rows 0; dlogits may alias logits (in place).
// The front is in loss.cpp; the device bodies in logprobs_impl.h.
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

void token_logprobs_forward(Tensor& logp, const Tensor& logits, const Tensor& lse, const Tensor& targets, ExecContext& ctx);
void token_logprobs_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                             const Tensor& dlogp, ExecContext& ctx);

}  // namespace scalelab::kernels
