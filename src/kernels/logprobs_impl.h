#pragma once
// The per-device bodies of loss.h's token_logprobs_forward / token_logprobs_backward (DPO's
// per-token log-probabilities). They are free functions that the front (loss.cpp) dispatches on
// the tensors' device — CPU here, CUDA in cuda/loss.cu (refusing stubs in no_cuda/), nothing on
// meta — rather than Backend methods: adding methods to the Backend interface rebuilds every
// backend source, CUDA's included, which this change avoided. Moving them into Backend later is
// mechanical (the signatures are the Backend shape). Arguments as loss.h; checked by the front.
#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

namespace cpu {
void token_logprobs_forward(Tensor& logp, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            ExecContext& ctx);
void token_logprobs_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                             const Tensor& dlogp, ExecContext& ctx);
}  // namespace cpu

namespace cuda {
void token_logprobs_forward(Tensor& logp, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            ExecContext& ctx);
void token_logprobs_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                             const Tensor& dlogp, ExecContext& ctx);
}  // namespace cuda

}  // namespace scalelab::kernels
