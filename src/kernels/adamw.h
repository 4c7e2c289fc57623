#pragma once
// AdamW and gradient clipping over flat buffers (adamw family). One loop over the whole
// parameter buffer; ranges without weight decay (biases, norm weights) are passed in.
//
// The update is torch.optim.AdamW's (what the Hugging Face Trainer uses), with `step` counted
// from 1:
//   g  ← g · grad_scale                         (clipping / loss-scale factor, see below)
//   p  ← p · (1 − lr·wd)                        (decoupled weight decay, only where decay)
//   m  ← β1·m + (1 − β1)·g
//   v  ← β2·v + (1 − β2)·g²
//   p  ← p − lr/(1 − β1^step) · m / (sqrt(v)/sqrt(1 − β2^step) + eps)
#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"

namespace scalelab::kernels {

struct AdamWHyper {
  float lr = 5e-5f;
  // bf16/fp16 parameters are rounded stochastically from the fp32 update (seeded by
  // rounding_seed, the step and the element index); fp32 parameters are written exactly.
  std::uint64_t rounding_seed = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t step = 1;  // 1-based, for bias correction
  // Multiplies every gradient as it is read: the clipping coefficient (and the inverse fp16 loss
  // scale) folded into the update, which saves a pass over the gradients.
  float grad_scale = 1.0f;
  // Added to an element's index in the buffers for its stochastic-rounding bits: an update of a
  // slice [b, e) of the whole buffer (--optimizer-in-backward, layer by layer) passes b, so each
  // element gets the bits the whole-buffer update would give it.
  std::int64_t index_base = 0;
};

struct ElementRange {
  std::int64_t begin = 0, end = 0;
  bool decay = true;
};

// The parts of `ranges` inside [begin, end), with offsets from begin: the ranges of an update of the
// slice [begin, end) of the buffers (a ZeRO-1 shard, a layer updated in backward).
std::vector<ElementRange> ranges_within(const std::vector<ElementRange>& ranges, std::int64_t begin, std::int64_t end);

// Updates the elements of the given ranges of the flat buffers (decay per range). params, m, v
// and grads have equal length and any float dtype each (e.g. bf16 params and grads with fp32 or
// bf16 states); the update is computed in fp32.
void adamw_update(Tensor& params, Tensor& m, Tensor& v, const Tensor& grads, const std::vector<ElementRange>& ranges,
                  const AdamWHyper& hyper, ExecContext& ctx);

// Rounds x to bf16 stochastically: up with probability equal to the remainder's fraction of the
// gap, using 16 random bits. NaN and infinity pass through.
bf16 stochastic_round_bf16(float x, std::uint32_t random16);
// The random bits used for element i at a step (counter-based, reproducible).
std::uint32_t rounding_bits(std::uint64_t seed, std::int64_t step, std::int64_t index);

// Sum of squares of g (double accumulation, deterministic for a thread count).
double sum_of_squares(const Tensor& g, ExecContext& ctx);
// True when g holds a NaN or an infinity (fp16 loss scaling skips such steps).
bool has_non_finite(const Tensor& g, ExecContext& ctx);
// g ← g · factor.
void scale_(Tensor& g, float factor, ExecContext& ctx);

// torch.nn.utils.clip_grad_norm_: total = sqrt(Σ g²); factor = min(1, max_norm / (total + 1e-6));
// applies it and returns the total norm before clipping. max_norm <= 0 disables clipping (the norm
// is still returned).
double clip_grad_norm_(Tensor& g, double max_norm, ExecContext& ctx);
// The same given a precomputed total norm (used when the sum of squares was all-reduced).
void clip_with_norm_(Tensor& g, double total_norm, double max_norm, ExecContext& ctx);
// The factor clip_grad_norm_ would multiply by: min(1, max_norm / (total_norm + 1e-6)), or 1 when
// max_norm <= 0.
double clip_coefficient(double total_norm, double max_norm);

}  // namespace scalelab::kernels
