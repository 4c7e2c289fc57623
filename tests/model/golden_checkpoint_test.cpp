// The golden Hugging Face directories of tests/golden/data (written by transformers, see
// tests/golden/make_golden.py) load into the flat buffer with the values the script recorded,
// their expected gradients use exactly the names and shapes of ParamLayout, and saving them again
// round-trips bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace scalelab {
namespace {

using testing::golden_dir;
using testing::host_alloc;
using testing::read_json;

class GoldenCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenCheckpoint, LoadsWithTheRecordedValues) {
  const std::string dir = golden_dir(GetParam());
  const auto expected = read_json(dir + "/expected.json");
  ASSERT_TRUE(has_weights(dir));
  const ModelConfig c = load_config_dir(dir);
  EXPECT_EQ(family_name(c.family), expected["family"].get<std::string>());
  const ParamLayout L = ParamLayout::build(c);
  Tensor flat = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  const LoadSummary s = load_weights(dir, c, L, flat);
  EXPECT_EQ(s.file_dtypes, std::vector<std::string>{"F32"});

  // The same parameters, names and shapes as PyTorch's named_parameters().
  const auto& init = expected["initial_params"];
  EXPECT_EQ(init.size(), L.params().size());
  for (const ParamInfo& p : L.params()) {
    ASSERT_TRUE(init.contains(p.name)) << p.name << " is not a parameter of the transformers model";
    const auto& rec = init[p.name];
    std::vector<std::int64_t> shape;
    for (int i = 0; i < p.shape.rank(); ++i) shape.push_back(p.shape[i]);
    EXPECT_EQ(rec["shape"].get<std::vector<std::int64_t>>(), shape) << p.name;
    const float* v = L.view(flat, p).f32();
    const auto first = rec["first"].get<std::vector<double>>();
    for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(v[i], static_cast<float>(first[i])) << p.name << "[" << i << "]";
    double sum = 0;
    for (std::int64_t i = 0; i < p.numel; ++i) sum += v[i];
    EXPECT_NEAR(sum, rec["sum"].get<double>(), 1e-9 * static_cast<double>(p.numel)) << p.name;
  }
}

TEST_P(GoldenCheckpoint, ExpectedDataMatchesTheLayout) {
  const std::string dir = golden_dir(GetParam());
  const auto expected = read_json(dir + "/expected.json");
  const ModelConfig c = load_config_dir(dir);
  const ParamLayout L = ParamLayout::build(c);
  const auto& t = expected["training"];
  const auto mb = t["micro_batch_size"].get<std::int64_t>(), seq = t["seq_len"].get<std::int64_t>();

  const auto f = SafetensorsFile::open(dir + "/expected.safetensors");
  const auto* logits = f.find("logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->shape, (std::vector<std::int64_t>{mb, seq, c.vocab_size}));
  std::size_t grads = 0;
  for (const ParamInfo& p : L.params()) {
    const auto* g = f.find("grad." + p.name);
    ASSERT_NE(g, nullptr) << "no gradient for " << p.name;
    EXPECT_TRUE(g->shape.size() == static_cast<std::size_t>(p.shape.rank()) && g->numel() == p.numel) << p.name;
    EXPECT_EQ(g->dtype_name, "F32");
    ++grads;
  }
  for (const auto& x : f.tensors()) grads -= x.name.starts_with("grad.");
  EXPECT_EQ(grads, 0u) << "expected.safetensors has gradients of parameters the layout lacks";
  // The decay rule of the golden run is ParamLayout's.
  for (const auto& n : expected["decay_params"]) EXPECT_TRUE(L.at(n.get<std::string>()).decay) << n;
  for (const auto& n : expected["no_decay_params"]) EXPECT_FALSE(L.at(n.get<std::string>()).decay) << n;

  // tokens.bin holds exactly the samples the run consumed, all inside the vocabulary.
  const auto tokens = testing::read_bytes(dir + "/tokens.bin");
  const auto samples = t["num_samples"].get<std::int64_t>();
  EXPECT_EQ(samples, t["max_steps"].get<std::int64_t>() * t["grad_accum_steps"].get<std::int64_t>() * mb);
  ASSERT_EQ(tokens.size(), static_cast<std::size_t>(samples * (seq + 1) * 4));
  for (std::size_t i = 0; i < tokens.size(); i += 4) {
    std::uint32_t id;
    std::memcpy(&id, tokens.data() + i, 4);
    ASSERT_LT(id, static_cast<std::uint32_t>(c.vocab_size));
  }
  EXPECT_EQ(expected["losses"].size(), t["max_steps"].get<std::size_t>());
}

TEST_P(GoldenCheckpoint, SaveReloadRoundTrips) {
  const std::string dir = golden_dir(GetParam());
  const ModelConfig c = load_config_dir(dir);
  const ParamLayout L = ParamLayout::build(c);
  Tensor a = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(dir, c, L, a);
  testing::ScratchDir out;
  save_checkpoint(out.str(), c, L, a);
  const ModelConfig c2 = load_config_dir(out.str());
  Tensor b = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(out.str(), c2, L, b);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  // The tensors transformers wrote and the ones scalelab wrote hold the same bytes.
  const auto theirs = SafetensorsFile::open(dir + "/model.safetensors");
  const auto ours = SafetensorsFile::open(out / "model.safetensors");
  EXPECT_EQ(theirs.tensors().size(), ours.tensors().size());
  for (const auto& t : theirs.tensors()) {
    const auto* o = ours.find(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->shape, t.shape);
    EXPECT_EQ(std::memcmp(ours.bytes(*o), theirs.bytes(t), t.end - t.begin), 0) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenCheckpoint,
                         ::testing::Values("llama_gqa_tied_rope3", "llama_untied_accum2", "opt_tiny",
                                           "opt_proj_postln_accum2", "qwen2_gqa_tied_bias_accum2"));

TEST(GoldenCheckpointSharded, TransformersBf16ShardsLoad) {
  // transformers' bf16, sharded save of llama_gqa_tied_rope3's weights.
  const std::string dir = golden_dir("llama_gqa_tied_rope3_bf16_sharded");
  const std::string ref = golden_dir("llama_gqa_tied_rope3");
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  ASSERT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
  const ModelConfig c = load_config_dir(dir);
  const ParamLayout L = ParamLayout::build(c);
  Tensor f32 = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(ref, load_config_dir(ref), L, f32);

  Tensor b = Tensor::empty({L.total_numel()}, DType::kBF16, host_alloc());
  const LoadSummary s = load_weights(dir, c, L, b);
  EXPECT_GE(s.files.size(), 2u);
  EXPECT_EQ(s.file_dtypes, std::vector<std::string>{"BF16"});
  // torch's .to(bfloat16) and ours round the same way: bit-identical.
  Tensor expect = Tensor::empty({L.total_numel()}, DType::kBF16, host_alloc());
  expect.copy_from(f32);
  EXPECT_EQ(std::memcmp(b.raw(), expect.raw(), b.nbytes()), 0);
  // Into an fp32 buffer: the bf16 values exactly.
  Tensor w = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(dir, c, L, w);
  Tensor expect32 = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  expect32.copy_from(expect);
  EXPECT_EQ(std::memcmp(w.raw(), expect32.raw(), w.nbytes()), 0);
}

}  // namespace
}  // namespace scalelab
