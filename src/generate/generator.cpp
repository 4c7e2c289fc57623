#include "generate/generator.h"

#include "model/adapter.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/gguf_model.h"
#include "model/init.h"
#include "train/data.h"

namespace scalelab {

nlohmann::json GenerationResult::to_json() const {
  return {{"tokens", tokens},   {"stop", stop},         {"prompt_tokens", prompt_tokens},
          {"prefill_s", prefill_s}, {"decode_s", decode_s},
          {"decode_tokens_per_s", tokens.size() > 1 && decode_s > 0
                                      ? static_cast<double>(tokens.size() - 1) / decode_s
                                      : 0.0}};
}

std::vector<std::int32_t> model_eos_token_ids(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (is_gguf_path(model_dir)) return gguf_eos_token_ids(model_dir);
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path p = fs::path(model_dir) / name;
    std::ifstream f(p);
    if (!f) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidInput("[generate] " + p.string() + " is not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const auto& e = j["eos_token_id"];
    std::vector<std::int32_t> ids;
    if (e.is_number_integer()) ids.push_back(e.get<std::int32_t>());
    else if (e.is_array())
      for (const auto& x : e)
        if (x.is_number_integer()) ids.push_back(x.get<std::int32_t>());
    if (!ids.empty()) return ids;
  }
  return {};
}

TextGenerator::TextGenerator(const std::string& model, const std::string& device_memory, std::uint64_t seed,
                             const std::string& adapter)
    : model_path_(model) {
  config_ = resolve_model(model);
  if (adapter.empty()) {
    layout_ = ParamLayout::build(config_);
  } else {
    LoraConfig lora = read_adapter_config(adapter);
    lora.dropout = 0;  // inference
    try {
      layout_ = ParamLayout::build(config_, "", lora);
    } catch (const InvalidInput& e) {
      throw InvalidInput("[--adapter] " + adapter + " does not fit " + config_.name + ": " + e.what());
    }
  }
  const std::size_t capacity = device_memory.empty() ? host_physical_memory() : parse_bytes(device_memory, "--device-memory");
  alloc_ = std::make_unique<DeviceAllocator>(make_host_backend(), capacity);
  ctx_.alloc = alloc_.get();
  params_ = Tensor::empty({layout_.total_numel()}, DType::kF32, *alloc_, "weights");
  if (!is_preset(model) && has_weights(model)) {
    load_weights(model, config_, layout_, params_);
    if (!adapter.empty()) load_adapter(adapter, layout_, params_);
  } else if (!is_preset(model)) {
    throw InvalidInput("[--model] " + model + " has no weights (model.safetensors) — generation needs a trained model");
  } else {
    init_params(params_, layout_, config_, seed);
    if (!adapter.empty()) load_adapter(adapter, layout_, params_);
  }
  // Inference computes no gradient: the models bind gradient views they never touch in forward,
  // so they point into a buffer of no memory (an external storage at null).
  no_grads_ = Tensor::from_external(nullptr, {layout_.trainable_numel()}, DType::kF32);
  ModelOptions mo;  // fp32, eager attention, no dropout
  model_ = make_model(config_, layout_, params_, no_grads_, mo);
}

TextGenerator::~TextGenerator() = default;

nlohmann::json TextGenerator::plan(std::int64_t positions) const {
  const std::size_t w = static_cast<std::size_t>(layout_.total_numel()) * sizeof(float);
  const std::size_t kv = KvCache::bytes(config_, positions);
  return {{"weights_bytes", w}, {"kv_cache_bytes", kv}, {"kv_cache_positions", positions}, {"total_bytes", w + kv}};
}

void TextGenerator::check_ids(const std::vector<std::int32_t>& ids, const char* what) const {
  if (ids.empty()) throw InvalidInput(std::string("[") + what + "] is empty — give at least one token");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      throw InvalidInput(std::string("[") + what + "] token " + std::to_string(ids[i]) + " at position " +
                         std::to_string(i) + " is outside the model's vocabulary [0, " +
                         std::to_string(config_.vocab_size) + ")");
    }
  }
}

void TextGenerator::start_sequence(std::int64_t max_len) {
  if (max_len > config_.max_position_embeddings) {
    throw InvalidInput("[--max-new-tokens] the prompt and the new tokens need " + std::to_string(max_len) +
                       " positions, more than the model's max_position_embeddings " +
                       std::to_string(config_.max_position_embeddings) + " — shorten the prompt or lower --max-new-tokens");
  }
  cache_ = KvCache();  // the previous cache goes back to the allocator first
  cache_ = KvCache::allocate(config_, max_len, *alloc_);
}

Tensor TextGenerator::forward_cached(const std::vector<std::int32_t>& ids) {
  check_ids(ids, "prompt");
  Batch b;
  b.batch = 1;
  b.seq = static_cast<std::int64_t>(ids.size());
  b.inputs = Tensor::empty({1, b.seq}, DType::kI32, *alloc_, "batch inputs");
  std::copy(ids.begin(), ids.end(), b.inputs.data<std::int32_t>());
  return model_->forward_cached(b, cache_, ctx_);
}

EvalRecord TextGenerator::validation_loss(const std::string& data_spec, std::int64_t seq_len, std::int64_t micro_batch,
                                          std::int64_t batches) {
  if (seq_len < 1 || seq_len > config_.max_position_embeddings) {
    throw InvalidInput("[--seq-len] must be in [1, " + std::to_string(config_.max_position_embeddings) +
                       "] (the model's max_position_embeddings), got " + std::to_string(seq_len));
  }
  if (micro_batch < 1) throw InvalidInput("[--micro-batch-size] must be positive");
  DataOptions d;
  d.spec = data_spec;
  d.seq_len = seq_len;
  d.micro_batch = micro_batch;
  d.vocab_size = config_.vocab_size;
  std::unique_ptr<DataSource> data;
  try {
    data = make_data_source(d, TextSourceOptions{"", model_path_, "--val-data"});
  } catch (const InvalidInput& e) {
    throw InvalidInput(std::string("[--val-data] ") + e.what());
  }
  StagedBatch batch;
  batch.host = make_batch(micro_batch, seq_len, *alloc_);
  batch.device = batch.host;
  EvalOptions eo;
  eo.batches = batches;
  return evaluate_loss(*model_, *data, batch, eo, ctx_);
}

GenerationResult TextGenerator::generate(const std::vector<std::int32_t>& prompt, const GenerateOptions& o,
                                         const std::function<void(std::int32_t)>& on_token) {
  check_ids(prompt, "prompt");
  if (o.max_new_tokens < 1) throw InvalidInput("[--max-new-tokens] must be >= 1");
  TokenSampler sampler(o.sampling);
  GenerationResult r;
  r.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  start_sequence(r.prompt_tokens + o.max_new_tokens);
  const std::int64_t V = config_.vocab_size;
  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = forward_cached(prompt);
  auto t1 = std::chrono::steady_clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.stop = "length";
  for (std::int64_t i = 0; i < o.max_new_tokens; ++i) {
    const float* last = logits.f32() + (logits.dim(0) - 1) * V;
    const std::int32_t tok = sampler.next({last, static_cast<std::size_t>(V)});
    logits = Tensor();
    r.tokens.push_back(tok);
    if (on_token) on_token(tok);
    if (std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), tok) != o.eos_token_ids.end()) {
      r.stop = "eos";
      break;
    }
    if (i + 1 == o.max_new_tokens) break;
    logits = forward_cached({tok});
  }
  r.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

}  // namespace scalelab
