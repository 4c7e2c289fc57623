// Generation and evaluation against transformers (tests/golden/make_textgen_golden.py): greedy
// `generate` token for token, the cached logits against transformers' logits and against our own
// full forward (recomputation), and the validation loss against `.loss`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel.h"
#include "generate/generator.h"
#include "model/safetensors.h"
#include "train/data.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

std::string case_dir(const std::string& name) {
  const char* e = std::getenv("SCALELAB_SOURCE_DIR");
  return std::string((e && *e) ? e : SCALELAB_SOURCE_DIR) + "/tests/golden/data/textgen/" + name;
}

nlohmann::json expected(const std::string& name) {
  std::ifstream in(case_dir(name) + "/expected.json");
  return nlohmann::json::parse(in);
}

std::vector<std::int32_t> ids(const nlohmann::json& j) { return j.get<std::vector<std::int32_t>>(); }

class Golden : public testing::TestWithParam<const char*> {};

TEST_P(Golden, GreedyGenerationEqualsTransformersTokenForToken) {
  set_num_threads(2);
  const auto e = expected(GetParam());
  TextGenerator gen(case_dir(GetParam()));
  for (const auto& g : e["generate"]) {
    GenerateOptions o;
    o.max_new_tokens = g["max_new_tokens"];
    const GenerationResult r = gen.generate(ids(g["prompt"]), o);
    EXPECT_EQ(r.tokens, ids(g["greedy"])) << g["prompt"];
    EXPECT_EQ(r.stop, "length");
    // With an EOS: stops right after emitting it, as transformers does (EOS in the output).
    o.eos_token_ids = {g["eos_token_id"].get<std::int32_t>()};
    std::vector<std::int32_t> streamed;
    const GenerationResult s = gen.generate(ids(g["prompt"]), o, [&](std::int32_t t) { streamed.push_back(t); });
    EXPECT_EQ(s.tokens, ids(g["greedy_with_eos"])) << g["prompt"];
    EXPECT_EQ(streamed, s.tokens);
    EXPECT_EQ(s.stop, s.tokens.size() < static_cast<std::size_t>(o.max_new_tokens) ? "eos" : "length");
  }
}

TEST_P(Golden, CachedLogitsEqualTransformersAndRecomputation) {
  set_num_threads(2);
  const auto e = expected(GetParam());
  const auto ref = SafetensorsFile::open(case_dir(GetParam()) + "/expected.safetensors");
  TextGenerator gen(case_dir(GetParam()));
  const std::int64_t V = gen.config().vocab_size;
  for (std::size_t i = 0; i < e["generate"].size(); ++i) {
    const auto& g = e["generate"][i];
    std::vector<std::int32_t> seq = ids(g["prompt"]);
    const auto gen_ids = ids(g["greedy"]);
    seq.insert(seq.end(), gen_ids.begin(), gen_ids.end() - 1);
    const auto* t = ref.find("logits." + std::to_string(i));
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->numel(), static_cast<std::int64_t>(seq.size()) * V);
    std::vector<float> hf(static_cast<std::size_t>(t->numel()));
    ref.read(*t, hf.data(), DType::kF32);
    // Prompt at once (prefill), then one token at a time through the cache.
    const std::size_t n_prompt = g["prompt"].size();
    gen.start_sequence(static_cast<std::int64_t>(seq.size()));
    std::vector<float> cached;
    Tensor l = gen.forward_cached({seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(n_prompt)});
    cached.insert(cached.end(), l.f32(), l.f32() + l.numel());
    for (std::size_t p = n_prompt; p < seq.size(); ++p) {
      l = gen.forward_cached({seq[p]});
      cached.insert(cached.end(), l.f32(), l.f32() + l.numel());
    }
    // Recomputation: the whole sequence in one forward without the cache (the training path).
    Batch b;
    b.batch = 1;
    b.seq = static_cast<std::int64_t>(seq.size());
    b.inputs = Tensor::empty({1, b.seq}, DType::kI32, gen.allocator());
    b.targets = Tensor::empty({1, b.seq}, DType::kI32, gen.allocator());
    std::copy(seq.begin(), seq.end(), b.inputs.data<std::int32_t>());
    std::copy(seq.begin(), seq.end(), b.targets.data<std::int32_t>());
    Tensor full;
    gen.model().forward_loss(b, gen.context(), &full);
    ASSERT_EQ(static_cast<std::size_t>(full.numel()), cached.size());
    // fp32 throughout; the cache changes only the order of the attention sums and the GEMMs' row
    // blocking. Logits here are O(10) with a vocab of 96 and 2 layers: a few ulps of O(10) through
    // two layers stays far below 1e-4 absolute; transformers' own kernels differ the same way.
    double worst_hf = 0, worst_re = 0;
    for (std::size_t k = 0; k < cached.size(); ++k) {
      worst_hf = std::max(worst_hf, static_cast<double>(std::fabs(cached[k] - hf[k])));
      worst_re = std::max(worst_re, static_cast<double>(std::fabs(cached[k] - full.f32()[k])));
    }
    EXPECT_LT(worst_hf, 1e-4) << "prompt " << i;
    EXPECT_LT(worst_re, 1e-4) << "prompt " << i;
  }
}

TEST_P(Golden, ValidationLossEqualsTransformersLoss) {
  // Through the trainer: --lr 0 leaves the weights as loaded (AdamW's step and its decay both
  // scale with the LR), so the evaluation after step 1 sees transformers' model.
  const auto e = expected(GetParam());
  for (std::int64_t mb : {1, 2, 3}) {
    TrainOptions o;
    o.model = case_dir(GetParam());
    o.data = case_dir(GetParam()) + "/val.bin";
    o.val_data = o.data;
    o.seq_len = e["seq_len"];
    o.micro_batch_size = mb;
    o.max_steps = 1;
    o.lr = 0;
    o.threads = 2;
    o.quiet = true;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.status, RunStatus::kOk) << r.error;
    ASSERT_EQ(r.evals.size(), 1u);
    // The whole set once: every one of the samples' targets exactly once, the remainder dropped.
    EXPECT_EQ(r.evals[0].tokens, e["val_samples"].get<std::int64_t>() * e["seq_len"].get<std::int64_t>());
    EXPECT_NEAR(r.evals[0].loss, e["val_loss"].get<double>(), 1e-5) << "micro-batch " << mb;
    EXPECT_NEAR(r.evals[0].perplexity, std::exp(e["val_loss"].get<double>()),
                1e-5 * std::exp(e["val_loss"].get<double>()));
  }
}

// `compare --val-data text:FILE` encodes the text with the model's own tokenizer (a GGUF's
// metadata here, a directory's tokenizer.json otherwise), so its loss equals train --val-data's.
TEST(Generate, TextValidationDataUsesTheModelsTokenizer) {
  const std::string src = [] {
    const char* e = std::getenv("SCALELAB_SOURCE_DIR");
    return std::string((e && *e) ? e : SCALELAB_SOURCE_DIR);
  }();
  const std::string text_path = testing::TempDir() + "scalelab_val_text_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(text_path);
    for (int i = 0; i < 8; ++i) out << "Held-out paragraph " << i << ": the quick brown fox jumps over the lazy dog.\n\n";
  }
  for (const std::string& model : std::vector<std::string>{src + "/tests/golden/data/gguf/llama_tiny.gguf", src + "/tests/golden/data/gguf/llama_tiny_hf"}) {
    TextGenerator gen(model);
    const EvalRecord ours = gen.validation_loss("text:" + text_path, 16, 2, 0);
    TrainOptions o;
    o.model = model;
    o.data = "text:" + text_path;
    o.val_data = "text:" + text_path;
    o.seq_len = 16;
    o.micro_batch_size = 2;
    o.max_steps = 1;
    o.lr = 0;  // the weights stay as loaded
    o.threads = 2;
    o.quiet = true;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.status, RunStatus::kOk) << r.error;
    ASSERT_EQ(r.evals.size(), 1u);
    EXPECT_GT(ours.tokens, 0) << model;
    EXPECT_EQ(ours.tokens, r.evals[0].tokens) << model;
    EXPECT_NEAR(ours.loss, r.evals[0].loss, 1e-6) << model;
  }
  std::remove(text_path.c_str());
}

INSTANTIATE_TEST_SUITE_P(TextGen, Golden, testing::Values("llama_gqa_untied", "llama_tied_rope3", "opt_prenorm"));

TEST(KvCache, AllocatedThroughTheAllocatorAsPlanned) {
  TextGenerator gen("llama-tiny");
  const std::size_t before = gen.allocator().stats().allocated;
  gen.start_sequence(40);
  const std::size_t kv = gen.allocator().stats().allocated - before;
  const std::size_t planned = gen.plan(40)["kv_cache_bytes"].get<std::size_t>();
  // One tensor per layer for K and one for V, each rounded up to the allocator's 512 bytes.
  const std::size_t tensors = 2 * static_cast<std::size_t>(gen.config().num_hidden_layers);
  EXPECT_GE(kv, planned);
  EXPECT_LT(kv, planned + tensors * DeviceAllocator::kRoundBytes);
  // Too long for the model: a clear error, not a crash.
  EXPECT_THROW(gen.start_sequence(gen.config().max_position_embeddings + 1), InvalidInput);
  // A capacity that cannot hold the cache: out of memory at allocation, before any token.
  TextGenerator small("llama-tiny", std::to_string(gen.plan(1)["weights_bytes"].get<std::size_t>() + 4096));
  GenerateOptions o;
  o.max_new_tokens = 100;
  EXPECT_THROW(small.generate({1, 2, 3}, o), OutOfMemory);
}

TEST(Generate, BadPromptsAreInvalidInput) {
  TextGenerator gen("llama-tiny");
  GenerateOptions o;
  o.max_new_tokens = 2;
  EXPECT_THROW(gen.generate({}, o), InvalidInput);
  EXPECT_THROW(gen.generate({static_cast<std::int32_t>(gen.config().vocab_size)}, o), InvalidInput);
  EXPECT_THROW(gen.generate({-1}, o), InvalidInput);
  o.max_new_tokens = 0;
  EXPECT_THROW(gen.generate({1}, o), InvalidInput);
}

}  // namespace
}  // namespace scalelab
