#pragma once
// Direct Preference Optimization (`scalelab dpo`, docs/finetuning.md): the data, the loss and the
// micro-step the trainer runs instead of the mean cross-entropy.
//
// Data: a JSONL file of preference pairs {"prompt", "chosen", "rejected"} (strings). The prompt is
// tokenized as tokenizer(prompt) (the template's BOS where it adds one), each completion as
// tokenizer(completion, add_special_tokens=False) followed by EOS when the tokenizer has one (trl's
// DPOTrainer tokenizes the three separately and appends EOS too). A micro-batch of B pairs is one
// batch of 2B rows, [chosen; rejected]: row i is prompt_i + chosen_i, row B + i prompt_i +
// rejected_i, shifted by one token as a causal LM's inputs and targets; the targets of prompt
// tokens and of padding are ignored (-100), so a row's log-probability is summed over its
// completion only. Rows are right-padded to seq_len (causal attention: padding after a row's last
// token changes nothing before it).
//
// Loss (trl's "sigmoid" loss): with π = log p_policy(completion | prompt) and ρ the reference's,
//   z = β·((π_c − π_r) − (ρ_c − ρ_r)),  loss = −(1 − ε)·log σ(z) − ε·log σ(−z)   (ε: label smoothing)
// averaged over the pairs; rewards β·(π − ρ) (chosen, rejected), their margin and the accuracy
// (chosen reward > rejected reward) are the logged metrics.
//
// Reference: under LoRA the same network with the adapters off (AdaptersOff, model/decoder/lora.h:
// no second copy); otherwise a frozen copy of the initial weights ("reference model" in the plan).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "model/model.h"
#include "train/data.h"
#include "train/device_setup.h"

namespace scalelab {

struct DpoOptions {
  bool enabled = false;
  std::string pairs;  // the JSONL file
  double beta = 0.1;
  double label_smoothing = 0.0;
};

// Throws InvalidInput naming the flag: beta > 0, label smoothing in [0, 0.5).
void validate_dpo_options(const DpoOptions& o);

// One tokenized pair and the line of the file it came from (1-based).
struct PreferencePair {
  std::vector<std::int32_t> prompt, chosen, rejected;
  std::int64_t line = 0;
};

struct PreferenceData {
  std::vector<PreferencePair> pairs;
  std::int64_t truncated = 0;  // pairs with a completion cut to fit seq_len
  std::string path;
};

// Reads and tokenizes `path` (tokenizer: text.tokenizer, else the --model directory's). Throws
// InvalidInput naming text.flag (--pairs, --val-data), the file and line: not a JSON object, a missing or non-string field, an
// empty completion, a prompt that leaves no room for a completion token in seq_len (prompt
// tokens > seq_len), an empty prompt (nothing to predict the first completion token from),
// token ids >= vocab_size; and an empty file.
PreferenceData read_preference_pairs(const std::string& path, std::int64_t seq_len, std::int64_t vocab_size,
                                     const TextSourceOptions& text);

// Writes pair `p` as rows (row, B + row) of a [2B, S] batch (host int32 inputs / targets).
void fill_pair_rows(const PreferencePair& p, std::int64_t row, std::int64_t B, std::int64_t S, std::int32_t pad_id,
                    Batch& batch);

// The data source: micro-batches of B pairs in file order (wrapping around), as [2B, S] batches;
// data-parallel rank r takes pairs [r·B, (r+1)·B) of each global micro-batch of world·B pairs.
std::unique_ptr<DataSource> make_preference_source(PreferenceData data, std::int64_t micro_batch, std::int64_t seq_len,
                                                   int rank, int world);

// Metrics of one micro-batch (means over its pairs).
struct DpoStats {
  double loss = 0, rewards_chosen = 0, rewards_rejected = 0, margin = 0, accuracy = 0;
  std::int64_t pairs = 0;
  void add(const DpoStats& s);  // accumulates a micro-batch (weighted by pairs)
  nlohmann::json to_json() const;
};

// The loss over B pairs from the summed log-probabilities (policy π, reference ρ; chosen then
// rejected). When grad is non-null it receives dloss/dπ for the 2B rows, times grad_scale.
DpoStats dpo_loss(const std::vector<double>& policy, const std::vector<double>& reference, double beta,
                  double label_smoothing, double grad_scale, std::vector<double>* grad);

// One DPO micro-step over a [2B, S] batch: the reference log-probabilities (`reference` when
// given, else `policy` with its adapters off), then the policy's forward, the loss and backward
// (gradients accumulate; grad_scale as forward_backward's). On the meta device nothing is read
// back: the same allocations are made and the stats are 0.
DpoStats dpo_micro_step(Model& policy, Model* reference, const Batch& batch, double beta, double label_smoothing,
                        float grad_scale, ExecContext& ctx);

// Evaluation on held-out pairs (--val-data with DPO; trl's eval_loss and eval_rewards/*): the
// reference and the policy forward only (no dropout, no gradient, nothing changed), in
// micro-batches of B pairs as [2B, S] batches (`batch`, reused: its host side is overwritten).
struct DpoEvalOptions {
  // Micro-batches per rank; 0: the whole set once (rank r takes pairs [(m·world + r)·B, +B) of
  // micro-batch m; the pairs past the end of the last global micro-batch are not counted).
  std::int64_t batches = 0;
  int rank = 0, world = 1;
  // Sums a per-rank value over the ranks (collective); null with one rank.
  std::function<double(double)> sum_over_ranks;
};
// The means over every evaluated pair of the loss, the rewards, the margin and the accuracy
// (trl averages per batch: the same when every batch is full); pairs = the pairs counted.
DpoStats evaluate_dpo(Model& policy, Model* reference, const PreferenceData& data, StagedBatch& batch, double beta,
                      double label_smoothing, const DpoEvalOptions& o, ExecContext& ctx);

}  // namespace scalelab
