#include "train/evaluate.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "kernels/loss.h"

namespace scalelab {

nlohmann::json EvalRecord::to_json() const {
  if (dpo) {
    return {{"step", step},
            {"val_loss", loss},
            {"val_rewards_chosen", dpo->rewards_chosen},
            {"val_rewards_rejected", dpo->rewards_rejected},
            {"val_reward_margin", dpo->margin},
            {"val_reward_accuracy", dpo->accuracy},
            {"val_pairs", dpo->pairs},
            {"val_batches", batches},
            {"seconds", seconds}};
  }
  return {{"step", step},       {"val_loss", loss},       {"val_perplexity", perplexity},
          {"val_tokens", tokens}, {"val_batches", batches}, {"seconds", seconds}};
}

EvalRecord evaluate_loss(Model& model, DataSource& data, StagedBatch& batch, const EvalOptions& o, ExecContext& ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t B = batch.host.batch, S = batch.host.seq;
  const std::int64_t n_samples = data.num_samples();
  std::int64_t batches = o.batches;
  if (batches <= 0) {
    if (n_samples <= 0) {
      throw InvalidInput("[--eval-batches] the validation data " + data.describe() +
                         " has no known size, so 'the whole set' (--eval-batches 0) is undefined — give "
                         "--eval-batches N");
    }
    const std::int64_t global = B * o.world;
    batches = (n_samples + global - 1) / global;
  }
  double sum = 0, count = 0;
  for (std::int64_t m = 0; m < batches; ++m) {
    data.next(batch.host);
    std::int64_t tokens = 0;
    auto* tg = batch.host.targets.data<std::int32_t>();
    for (std::int64_t i = 0; i < B; ++i) {
      const std::int64_t g = (m * o.world + o.rank) * B + i;  // the sample's index in the set
      std::int32_t* row = tg + i * S;
      if (o.batches <= 0 && g >= n_samples) {
        for (std::int64_t p = 0; p < S; ++p) row[p] = kernels::kIgnoreIndex;  // past the end: no second count
        continue;
      }
      for (std::int64_t p = 0; p < S; ++p) tokens += row[p] != kernels::kIgnoreIndex;
    }
    if (tokens == 0) continue;  // forward_loss of an all-ignored batch is 0 and weighs nothing
    batch.upload();
    const double mean = model.forward_loss(batch.device, ctx);
    sum += mean * static_cast<double>(tokens);
    count += static_cast<double>(tokens);
  }
  if (o.sum_over_ranks) {
    sum = o.sum_over_ranks(sum);
    count = o.sum_over_ranks(count);
  }
  if (!(count > 0)) {
    throw InvalidInput("[--val-data] " + data.describe() +
                       " gave no target token to evaluate (every target is masked) — use other validation data");
  }
  EvalRecord r;
  r.loss = sum / count;
  r.perplexity = std::exp(r.loss);
  r.tokens = static_cast<std::int64_t>(count);
  r.batches = batches;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace scalelab
