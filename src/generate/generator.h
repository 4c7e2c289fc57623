#pragma once
// Text generation with a KV cache (scalelab generate, scalelab compare): a model loaded from a
// Hugging Face directory in fp32, a prompt of token ids run through it once (prefill), then one
// token at a time through the cache (decode), each new token chosen by the sampler
// (generate/sampling.h), streamed to a callback as soon as it is chosen, until an EOS token or
// max_new_tokens.
//
// Memory: the weights and the cache come from the generator's allocator (capacity
// --device-memory, else the host's memory), the cache sized for prompt + max_new_tokens positions
// before the first token (KvCache::bytes); plan() says what a generation will hold.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/context.h"
#include "generate/sampling.h"
#include "model/config.h"
#include "model/decoder/kv_cache.h"
#include "model/model.h"
#include "model/params.h"
#include "train/evaluate.h"

namespace scalelab {

struct GenerateOptions {
  SamplingOptions sampling;
  std::int64_t max_new_tokens = 128;
  // Generation stops after emitting any of these (the EOS is part of the output, as in
  // transformers). Empty: none (stop at max_new_tokens).
  std::vector<std::int32_t> eos_token_ids;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // the new tokens, EOS included when it stopped there
  std::string stop;                  // "eos" or "length"
  std::int64_t prompt_tokens = 0;
  double prefill_s = 0, decode_s = 0;  // decode: the tokens after the first
  nlohmann::json to_json() const;
};

// The EOS ids of a model directory: generation_config.json's "eos_token_id" (an id or a list),
// else config.json's; a GGUF file's tokenizer.ggml.eos_token_id; empty when there is none (or
// for a preset name).
std::vector<std::int32_t> model_eos_token_ids(const std::string& model_dir);

class TextGenerator {
 public:
  // Loads `model` (a directory with config.json and weights; a preset name gets random weights
  // from `seed`, for tests and benchmarks). device_memory: the allocator's capacity ("" = host
  // memory). Throws InvalidInput for a bad model directory.
  // adapter: a PEFT LoRA adapter directory applied on top of the model (empty: none).
  explicit TextGenerator(const std::string& model, const std::string& device_memory = "", std::uint64_t seed = 0,
                         const std::string& adapter = "");
  TextGenerator(const TextGenerator&) = delete;
  TextGenerator& operator=(const TextGenerator&) = delete;
  ~TextGenerator();

  // Generates after `prompt` (ids < vocab_size, at least one); on_token gets each new token as
  // it is chosen. Throws InvalidInput for a bad prompt or when prompt + max_new_tokens exceeds
  // max_position_embeddings; OutOfMemory when the cache does not fit.
  GenerationResult generate(const std::vector<std::int32_t>& prompt, const GenerateOptions& o,
                            const std::function<void(std::int32_t)>& on_token = {});

  // The logits [n, vocab] of `ids` run through the cache after what it holds (tests: cached
  // logits against a full forward). start_sequence allocates the cache for max_len positions.
  void start_sequence(std::int64_t max_len);
  Tensor forward_cached(const std::vector<std::int32_t>& ids);

  // Validation loss and perplexity of the model on `data_spec` (the forms of train --data):
  // micro-batches of micro_batch samples of seq_len + 1 tokens, `batches` of them (0: the whole
  // set), as train --val-data computes it (train/evaluate.h). Text specs are encoded with the
  // model's tokenizer (its directory's tokenizer.json or the GGUF's metadata).
  EvalRecord validation_loss(const std::string& data_spec, std::int64_t seq_len, std::int64_t micro_batch,
                             std::int64_t batches);

  const ModelConfig& config() const { return config_; }
  Model& model() { return *model_; }
  ExecContext& context() { return ctx_; }
  DeviceAllocator& allocator() { return *alloc_; }
  std::int64_t params() const { return layout_.total_numel(); }
  // Bytes: weights, the cache for `positions` positions, and their sum.
  nlohmann::json plan(std::int64_t positions) const;

 private:
  void check_ids(const std::vector<std::int32_t>& ids, const char* what) const;
  std::string model_path_;  // --model: its tokenizer encodes text:/jsonl: validation data
  ModelConfig config_;
  ParamLayout layout_;
  std::unique_ptr<DeviceAllocator> alloc_;
  ExecContext ctx_;
  Tensor params_, no_grads_;
  std::unique_ptr<Model> model_;
  KvCache cache_;
};

}  // namespace scalelab
