#pragma once
// Dropout (dropout family), as torch.nn.functional.dropout in training mode: each element is
// zeroed with probability p and the kept ones are scaled by 1 / (1 − p).
//
// The mask is never stored. Element i of a call keyed by (seed, step, layer, site) is kept when
// the 32-bit word (i mod 4) of Philox4x32-10(counter = (i / 4, layer·16 + site, step), key = seed)
// is >= round(p · 2^32). A counter-based generator makes the mask a pure function of its key and
// the element index, so backward (and the recomputed forward under activation checkpointing)
// regenerate exactly the forward's mask at the cost of one Philox block per four elements, for
// any thread count. The masks differ from PyTorch's (a different generator); their statistics
// are the same.
//   dropout_forward:  x ← x · mask / (1 − p)          (in place)
//   dropout_backward: dx = dy · mask / (1 − p)        (assigned; dx may alias dy)
// p = 0 makes both the identity (dropout_backward then copies). Compute is fp32; tensors may be
// fp32, bf16 or fp16.
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

struct DropoutKey {
  std::uint64_t seed = 0;
  std::int64_t step = 0;   // micro-step: a new mask every forward
  std::int64_t layer = 0;  // decoder layer
  std::int64_t site = 0;   // dropout site within the layer, 0..15
};

void dropout_forward(Tensor& x, float p, const DropoutKey& key, ExecContext& ctx);
void dropout_backward(Tensor& dx, const Tensor& dy, float p, const DropoutKey& key, ExecContext& ctx);

// The keep decision for element i (what the kernels apply); for tests.
bool dropout_keep(float p, const DropoutKey& key, std::int64_t i);

}  // namespace scalelab::kernels
