// Cross-entropy on the CPU (loss.h).
#include "kernels/loss.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "core/error.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/stage.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/logprobs_impl.h"

namespace scalelab::kernels::cpu {

namespace {
void check_target(std::int32_t t, std::int64_t V, std::int64_t row) {
  if (t != kIgnoreIndex && (t < 0 || t >= V)) {
    throw InvalidInput("[cross_entropy] target " + std::to_string(t) + " at row " + std::to_string(row) +
                       " is outside the vocabulary of " + std::to_string(V) +
                       " — the data does not match the model's vocab_size");
  }
}
}  // namespace

LossSum CpuBackend::cross_entropy_forward(Tensor& lse, const Tensor& logits, const Tensor& targets, ExecContext&) {
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  const std::int32_t* tg = targets.data<std::int32_t>();
  float* l = lse.f32();
  for (std::int64_t r = 0; r < rows; ++r) check_target(tg[r], V, r);
  std::vector<double> per_row(static_cast<std::size_t>(rows), 0.0);
  parallel_for(rows, row_grain(V), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* row = load_row(elem(logits.raw(), logits.dtype(), r * V), logits.dtype(), V, 0);
      const float m = vec::max_of(row, V);
      const float s = vec::exp_shift_sum(row, V, m);
      l[r] = m + std::log(s);
      if (tg[r] != kIgnoreIndex) per_row[static_cast<std::size_t>(r)] = static_cast<double>(l[r]) - row[tg[r]];
    }
  });
  LossSum out;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (tg[r] == kIgnoreIndex) continue;
    out.sum += per_row[static_cast<std::size_t>(r)];
    ++out.count;
  }
  return out;
}

void CpuBackend::cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                        const Tensor& targets, float grad_scale, ExecContext&) {
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  const float* l = lse.f32();
  const std::int32_t* tg = targets.data<std::int32_t>();
  parallel_for(rows, row_grain(V), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      void* dst = elem(dlogits.raw(), dlogits.dtype(), r * V);
      // Read the logits row before writing: dlogits may alias logits.
      const float* row = load_row(elem(logits.raw(), logits.dtype(), r * V), logits.dtype(), V, 0);
      float* dr = out_row(dst, dlogits.dtype(), V, 1);
      if (tg[r] == kIgnoreIndex) {
        for (std::int64_t j = 0; j < V; ++j) dr[j] = 0.0f;
      } else {
        vec::exp_shift_sum(row, dr, V, l[r]);  // softmax = exp(x − lse)
        for (std::int64_t j = 0; j < V; ++j) dr[j] *= grad_scale;
        dr[tg[r]] -= grad_scale;
      }
      store_row(dr, dst, dlogits.dtype(), V);
    }
  });
}

void token_logprobs_forward(Tensor& logp, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                                ExecContext&) {
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  const std::int32_t* tg = targets.data<std::int32_t>();
  const float* l = lse.f32();
  float* out = logp.f32();
  for (std::int64_t r = 0; r < rows; ++r) {
    check_target(tg[r], V, r);
    if (tg[r] == kIgnoreIndex) {
      out[r] = 0.0f;
      continue;
    }
    const float x = load_row(elem(logits.raw(), logits.dtype(), r * V + tg[r]), logits.dtype(), 1, 0)[0];
    out[r] = x - l[r];
  }
}

void token_logprobs_backward(Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                                 const Tensor& targets, const Tensor& weights, ExecContext&) {
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  const float* l = lse.f32();
  const float* w = weights.f32();
  const std::int32_t* tg = targets.data<std::int32_t>();
  parallel_for(rows, row_grain(V), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      void* dst = elem(dlogits.raw(), dlogits.dtype(), r * V);
      const float* row = load_row(elem(logits.raw(), logits.dtype(), r * V), logits.dtype(), V, 0);
      float* dr = out_row(dst, dlogits.dtype(), V, 1);
      if (tg[r] == kIgnoreIndex) {
        for (std::int64_t j = 0; j < V; ++j) dr[j] = 0.0f;
      } else {
        const float s = -w[r];  // d logp / d logits = onehot − softmax
        vec::exp_shift_sum(row, dr, V, l[r]);
        for (std::int64_t j = 0; j < V; ++j) dr[j] *= s;
        dr[tg[r]] -= s;
      }
      store_row(dr, dst, dlogits.dtype(), V);
    }
  });
}

std::int64_t CpuBackend::count_target_tokens(const Tensor& targets, ExecContext&) {
  const std::int32_t* tg = targets.data<std::int32_t>();
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < targets.numel(); ++r) n += tg[r] != kIgnoreIndex;
  return n;
}

}  // namespace scalelab::kernels::cpu
