#pragma once
// Validation loss: the model's mean cross-entropy over held-out micro-batches, weighted by the
// target tokens of each micro-batch (as torchtune's evaluation and as one Hugging Face `.loss` over
// the concatenated set): sum over batches of (mean loss · target tokens) / all target tokens.
// Perplexity is exp(loss). Forward only (the model's forward_loss: no dropout, no gradients, no
// parameter change), so evaluating inside a run leaves its training trajectory bit for bit as it is.
#include <cstdint>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "model/model.h"
#include "train/data.h"
#include "train/device_setup.h"
#include "train/dpo.h"

namespace scalelab {

// A DPO run's evaluation (train/dpo.h evaluate_dpo) fills `dpo` and `loss` (its DPO loss) and has
// no perplexity nor tokens: the record writes val_loss, val_rewards_chosen, val_rewards_rejected,
// val_reward_margin, val_reward_accuracy and val_pairs (trl's eval_loss and eval_rewards/*).
struct EvalRecord {
  std::int64_t step = 0;     // optimizer steps done when it ran (0: before training)
  double loss = 0;           // token-weighted mean cross-entropy (DPO: the mean DPO loss over pairs)
  double perplexity = 0;     // exp(loss); unused (null in the record) for DPO
  std::int64_t tokens = 0;   // target tokens counted (all ranks)
  std::int64_t batches = 0;  // micro-batches evaluated per rank
  double seconds = 0;
  std::optional<DpoStats> dpo;  // DPO: the held-out pairs' metrics
  nlohmann::json to_json() const;
};

struct EvalOptions {
  // Micro-batches per rank; 0: one pass over the whole set (data.num_samples() must be known),
  // the samples past its end in the last global micro-batch masked out of the loss.
  std::int64_t batches = 0;
  int rank = 0, world = 1;
  // Sums a per-rank value over the ranks (collective); null with one rank.
  std::function<double(double)> sum_over_ranks;
};

// Reads the micro-batches from `data` (a fresh source: it starts at sample 0) into `batch` and runs
// model.forward_loss on each. Throws InvalidInput when batches is 0 and the set's size is unknown,
// or when no target token was evaluated.
EvalRecord evaluate_loss(Model& model, DataSource& data, StagedBatch& batch, const EvalOptions& o, ExecContext& ctx);

}  // namespace scalelab
