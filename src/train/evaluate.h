#pragma once
// Validation loss: the model's mean cross-entropy over held-out micro-batches, weighted by the
// target tokens of each micro-batch (as torchtune's evaluation and as one Hugging Face `.loss` over
// the concatenated set): sum over batches of (mean loss · target tokens) / all target tokens.
// Perplexity is exp(loss). Forward only (the model's forward_loss: no dropout, no gradients, no
// parameter change), so evaluating inside a run leaves its training trajectory bit for bit as it is.
#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "model/model.h"
#include "train/data.h"
#include "train/device_setup.h"

namespace scalelab {

struct EvalRecord {
  std::int64_t step = 0;     // optimizer steps done when it ran (0: before training)
  double loss = 0;           // token-weighted mean cross-entropy
  double perplexity = 0;     // exp(loss)
  std::int64_t tokens = 0;   // target tokens counted (all ranks)
  std::int64_t batches = 0;  // micro-batches evaluated per rank
  double seconds = 0;
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
