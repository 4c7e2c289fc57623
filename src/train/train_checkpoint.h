#pragma once
// Checkpoints during training (--save-every N --save DIR, --resume DIR/checkpoint-K,
// --save-total-limit K), laid out as the Hugging Face Trainer's output directory:
//   DIR/checkpoint-STEP/config.json, model.safetensors   the model, loadable by transformers
//                                                         (the master weights, in their dtype)
//   DIR/checkpoint-STEP/optimizer.safetensors             AdamW's exp_avg and exp_avg_sq, flat over
//                                                         the trainable parameters, in their dtype
//   DIR/checkpoint-STEP/trainer_state.json                the step, the LR-scheduler step, the fp16
//                                                         loss scale, the data position, the RNG
//                                                         state and the configuration it ran with
// Everything random in a run is counter-based (synthetic data by sample index, dropout masks by
// micro-step, stochastic rounding by step: kernels/dropout.h, kernels/adamw.h), so the RNG state is
// the seed and the step; the data position is the number of micro-batches read, per rank (every
// built-in source computes a sample from its index, so a resumed run seeks there: DataSource::skip).
// Data-parallel runs (DDP or ZeRO-1) write the same directory: rank 0 writes it, with ZeRO-1's
// optimizer-state shards gathered first, so a checkpoint's optimizer.safetensors is the whole flat
// state whatever the ranks were; resuming needs the same world size (the data is split by rank).
// A checkpoint is written under a temporary name and renamed: a crash leaves no half checkpoint.
//
// What never changes during a run and is rebuilt from --model rather than saved: a DPO run's frozen
// reference model under full fine-tuning (the initial weights) and a QLoRA run's NF4 base (the
// base quantized; a QLoRA checkpoint's model.safetensors holds the dense parameters and the
// adapters only). trainer_state.json records their CRC-32 ("rebuilt_from_model"), and a resumed
// run checks what it rebuilt against it (check_rebuilt): another --model, or a model directory
// changed since, exits 2 instead of continuing against another reference or base.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

namespace scalelab {

struct TrainCheckpointState {
  std::int64_t global_step = 0;           // optimizer steps done (the LR scheduler's step)
  std::int64_t micro_batches_read = 0;    // data position, per rank
  double loss_scale = 1.0;                // fp16 dynamic loss scale
  std::int64_t good_steps = 0;            // steps since the loss scale last changed
  std::int64_t skipped_steps = 0;
  std::uint64_t seed = 0;                 // the counter-based generators' key
  nlohmann::json config;                  // the run's resolved configuration (TrainResult::config)
  std::vector<double> losses;             // the losses of the steps so far
  // What the run rebuilds from --model on --resume, by part ("dpo_reference", "nf4_base"): each
  // {"crc32", "bytes", "source", "what"}; null when nothing is.
  nlohmann::json rebuilt;
  nlohmann::json to_json() const;
};

// Throws InvalidInput naming --resume when a part of `now` (rebuilt by this run, as
// TrainCheckpointState::rebuilt) is absent from `saved` or has another CRC-32.
void check_rebuilt(const std::string& dir, const nlohmann::json& saved, const nlohmann::json& now);

// The configuration entries a resumed run must share with its checkpoint for a bit-identical
// continuation: model config, sizes, optimizer and schedule, precision, seed, data, freeze, ranks.
const std::vector<std::string>& resume_checked_keys();

// "checkpoint-<step>" under root.
std::string checkpoint_dir_name(const std::string& root, std::int64_t step);

// Writes root/checkpoint-<state.global_step> (replacing one of the same step) from host tensors:
// params (layout.total_numel(), saved as `param_dtype`), m and v (trainable numel), with the side
// files of `source_model` (copy_model_side_files). Throws InvalidInput when root cannot be written.
void save_train_checkpoint(const std::string& root, const ModelConfig& config, const ParamLayout& layout,
                           const Tensor& params, DType param_dtype, const Tensor& m, const Tensor& v,
                           const TrainCheckpointState& state, const std::string& source_model = "");

// The files that travel with a model directory without being weights: generation_config.json (the
// EOS generate stops at) and the tokenizer's files (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, chat_template.jinja). Copies those present in `from` (when it is a directory) into `to`, so
// a saved or checkpointed model generates and tokenizes as its source did; from a GGUF file,
// writes them from its metadata (write_gguf_side_files). Returns the names copied or written.
std::vector<std::string> copy_model_side_files(const std::string& from, const std::string& to);

// Keeps at most `limit` checkpoint-<step> directories in root (limit 0: all): the one of step
// `current` (just written) always, and removes the others lowest step first — so stale
// checkpoints an earlier run left with higher steps go before this run's. Returns the removed paths.
std::vector<std::string> rotate_checkpoints(const std::string& root, std::int64_t limit, std::int64_t current);

// Reads dir/trainer_state.json; throws InvalidInput naming the file when it is missing or malformed.
TrainCheckpointState read_train_state(const std::string& dir);

// Throws InvalidInput naming every checked entry whose value differs between the checkpoint's
// configuration and this run's ("--resume <dir>: seq_len 16 in the checkpoint, 32 now; ...").
void check_resume_config(const std::string& dir, const nlohmann::json& saved, const nlohmann::json& now);

// Loads tensor `name` ("exp_avg" or "exp_avg_sq") of dir/optimizer.safetensors into dst (a host
// tensor of the run's state dtype): the whole flat state (`total` elements, default dst.numel()),
// or under ZeRO-1 this rank's segment [begin, begin + dst.numel()) of it; throws InvalidInput
// naming the file on a missing tensor or a size mismatch.
void load_optimizer_state(const std::string& dir, const std::string& name, const Tensor& dst, std::int64_t begin = 0,
                          std::int64_t total = -1);

}  // namespace scalelab
