#pragma once
// Cross-entropy loss over logits (loss family).
//
//   cross_entropy_forward: per row, lse = log Σ exp(logits); loss_t = lse − logits[target_t].
//     Returns Σ loss_t over rows whose target is not kIgnoreIndex (and the count), so a caller
//     takes the mean as Hugging Face does (mean over target tokens). Saves lse[rows].
//   cross_entropy_backward: dlogits = (softmax(logits) − onehot(target)) · grad_scale, assigned;
//     rows with an ignored target get 0. dlogits may alias logits (in place).
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

constexpr std::int32_t kIgnoreIndex = -100;

struct LossSum {
  double sum = 0.0;
  std::int64_t count = 0;
};

LossSum cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets, ExecContext& ctx);
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            float grad_scale, ExecContext& ctx);

}  // namespace scalelab::kernels
