#include "model/checkpoint.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "model/init.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::host_alloc;
using testing::read_bytes;
using testing::ScratchDir;

ModelConfig tiny_llama(bool tied) {
  ModelConfig c = preset_config("llama-tiny");
  c.tie_word_embeddings = tied;
  c.name = "tiny-llama-test";
  return c;
}

ModelConfig tiny_opt(std::int64_t proj) {
  ModelConfig c = preset_config("opt-tiny");
  c.word_embed_proj_dim = proj;
  c.max_position_embeddings = 32;
  c.do_layer_norm_before = proj == c.hidden_size;
  c.name = "tiny-opt-test";
  return c;
}

Tensor initialized(const ModelConfig& c, const ParamLayout& L, DType dt = DType::kF32, std::uint64_t seed = 7) {
  Tensor t = Tensor::empty({L.total_numel()}, dt, host_alloc(), "params");
  init_params(t, L, c, seed);
  // Norm weights and biases of a fresh model are constants; perturb them so a swapped or skipped
  // tensor cannot go unnoticed.
  for (const auto& p : L.params()) {
    if (!(p.is_norm || p.is_bias)) continue;
    Tensor v = L.view(t, p);
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const float x = 1.0f + 0.001f * static_cast<float>(i % 97) + 0.01f * static_cast<float>(p.offset % 13);
      convert(&x, DType::kF32, static_cast<std::uint8_t*>(v.raw()) + i * dtype_size(dt), dt, 1);
    }
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::string load_error(const std::string& dir, const ModelConfig& c) {
  const ParamLayout L = ParamLayout::build(c);
  Tensor t = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  try {
    load_weights(dir, c, L, t);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  ADD_FAILURE() << "load_weights(" << dir << ") did not throw";
  return "";
}

// Rewrites dir/model.safetensors with `edit` applied to its list of tensors (fp32 sources).
void rewrite(const std::string& dir, const std::function<void(std::vector<SafetensorsSource>&)>& edit,
             std::vector<std::vector<float>>& keep) {
  const std::string path = dir + "/model.safetensors";
  std::vector<SafetensorsSource> src;
  {
    const auto f = SafetensorsFile::open(path);
    for (const auto& t : f.tensors()) {
      keep.emplace_back(static_cast<std::size_t>(t.numel()));
      f.read(t, keep.back().data(), DType::kF32);
      src.push_back({t.name, t.shape, keep.back().data(), DType::kF32, *t.dtype});
    }
  }
  edit(src);
  write_safetensors(path, src);
}

TEST(Checkpoint, SaveReloadIsBitIdentical) {
  for (const auto& c : {tiny_llama(true), tiny_llama(false), tiny_opt(64), tiny_opt(32)}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      ScratchDir dir;
      const ParamLayout L = ParamLayout::build(c);
      const Tensor a = initialized(c, L, dt);
      SaveOptions o;
      o.dtype = dt;
      save_checkpoint(dir.str(), c, L, a, o);
      EXPECT_TRUE(has_weights(dir.str()));
      const ModelConfig back = load_config_dir(dir.str());
      EXPECT_EQ(back.family, c.family);
      EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
      EXPECT_EQ(back.word_embed_proj_dim, c.word_embed_proj_dim);
      EXPECT_EQ(testing::read_json(dir / "config.json")["torch_dtype"], dt == DType::kF32 ? "float32" : "bfloat16");
      Tensor b = Tensor::zeros({L.total_numel()}, dt, host_alloc());
      const LoadSummary s = load_weights(dir.str(), back, L, b);
      EXPECT_TRUE(same_bytes(a, b)) << family_name(c.family) << " " << dtype_name(dt);
      EXPECT_EQ(s.tensors, static_cast<std::int64_t>(L.params().size()));
      EXPECT_EQ(s.files.size(), 1u);
      // Saving what was loaded gives the same file, byte for byte.
      ScratchDir dir2;
      save_checkpoint(dir2.str(), back, L, b, o);
      EXPECT_EQ(read_bytes(dir / "model.safetensors"), read_bytes(dir2 / "model.safetensors"));
      const auto f = SafetensorsFile::open(dir / "model.safetensors");
      EXPECT_EQ(f.find("lm_head.weight") != nullptr, !c.tie_word_embeddings) << "tied models save no lm_head";
    }
  }
}

TEST(Checkpoint, ConvertsBetweenDtypesOnSaveAndLoad) {
  const ModelConfig c = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(c);
  const Tensor f32 = initialized(c, L);
  Tensor expect_bf16 = Tensor::empty({L.total_numel()}, DType::kBF16, host_alloc());
  expect_bf16.copy_from(f32);
  for (DType file : {DType::kBF16, DType::kF16}) {
    ScratchDir dir;
    save_checkpoint(dir.str(), c, L, f32, {file, 0});
    EXPECT_EQ(SafetensorsFile::open(dir / "model.safetensors").tensors()[0].dtype_name,
              file == DType::kBF16 ? "BF16" : "F16");
    // fp32 buffer from a 16-bit file: the 16-bit values exactly.
    Tensor back = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
    load_weights(dir.str(), c, L, back);
    Tensor expect = Tensor::empty({L.total_numel()}, file, host_alloc());
    expect.copy_from(f32);
    Tensor expect32 = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
    expect32.copy_from(expect);
    EXPECT_TRUE(same_bytes(back, expect32));
  }
  // A bf16 run from an fp32 file: round to nearest even, as torch's .to(bfloat16).
  ScratchDir dir;
  save_checkpoint(dir.str(), c, L, f32);
  Tensor b = Tensor::empty({L.total_numel()}, DType::kBF16, host_alloc());
  load_weights(dir.str(), c, L, b);
  EXPECT_TRUE(same_bytes(b, expect_bf16));
}

TEST(Checkpoint, ShardedSaveAndLoad) {
  const ModelConfig c = tiny_llama(false);
  const ParamLayout L = ParamLayout::build(c);
  const Tensor a = initialized(c, L);
  ScratchDir dir;
  // 40 KB shards: the 64 KB embedding and lm_head get shards of their own.
  save_checkpoint(dir.str(), c, L, a, {DType::kF32, 40000});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const auto index = testing::read_json(dir / "model.safetensors.index.json");
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GE(files.size(), 4u);
  std::uint64_t total = 0;
  for (const auto& f : files) {
    EXPECT_TRUE(fs::exists(dir / f)) << f;
    const auto sf = SafetensorsFile::open(dir / f);
    std::uint64_t bytes = 0;
    for (const auto& t : sf.tensors()) bytes += t.end - t.begin;
    EXPECT_TRUE(bytes <= 40000 || sf.tensors().size() == 1) << f << " holds " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), L.params().size());
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", files.size());
  EXPECT_EQ(*files.begin(), first);

  Tensor b = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
  const LoadSummary s = load_weights(dir.str(), c, L, b);
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_EQ(s.files.size(), files.size());

  // Saving again unsharded removes the shards and the index (a stale index must not linger).
  save_checkpoint(dir.str(), c, L, a);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  for (const auto& f : files) EXPECT_FALSE(fs::exists(dir / f)) << f;
  // And sharded again removes model.safetensors.
  save_checkpoint(dir.str(), c, L, a, {DType::kF32, 40000});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  Tensor d = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(dir.str(), c, L, d);
  EXPECT_TRUE(same_bytes(a, d));
}

TEST(CheckpointBadInput, BrokenShardIndex) {
  const ModelConfig c = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(c);
  const Tensor a = initialized(c, L);
  // Saves a sharded checkpoint; returns its index.
  auto make = [&](const ScratchDir& dir) {
    save_checkpoint(dir.str(), c, L, a, {DType::kF32, 40000});
    return testing::read_json(dir / "model.safetensors.index.json");
  };
  auto write_index = [](const ScratchDir& dir, const nlohmann::json& j) {
    std::ofstream(dir / "model.safetensors.index.json") << j.dump();
  };
  {
    ScratchDir dir;
    const auto j = make(dir);
    const std::string shard = j["weight_map"]["model.norm.weight"];
    fs::remove(dir / shard);
    const std::string e = load_error(dir.str(), c);
    EXPECT_THAT(e, HasSubstr(shard + ", which is not in"));
    EXPECT_THAT(e, HasSubstr("copy every shard"));
  }
  {
    ScratchDir dir;
    auto j = make(dir);
    const std::string first = j["weight_map"]["model.embed_tokens.weight"];
    ASSERT_NE(j["weight_map"]["model.norm.weight"], first);
    j["weight_map"]["model.norm.weight"] = first;  // the index points to the wrong shard
    write_index(dir, j);
    const std::string e = load_error(dir.str(), c);
    EXPECT_THAT(e, HasSubstr("'model.norm.weight'"));
    EXPECT_THAT(e, HasSubstr("do not belong together"));
  }
  {
    ScratchDir dir;
    auto j = make(dir);
    j["weight_map"]["model.extra.weight"] = j["weight_map"]["model.norm.weight"];
    write_index(dir, j);
    const std::string e = load_error(dir.str(), c);
    EXPECT_THAT(e, HasSubstr("'model.extra.weight'"));
    EXPECT_THAT(e, HasSubstr("stale"));
  }
  {
    ScratchDir dir;
    auto j = make(dir);
    j["weight_map"]["model.norm.weight"] = "../model.safetensors";
    write_index(dir, j);
    EXPECT_THAT(load_error(dir.str(), c), HasSubstr("not a plain file name"));
  }
  {
    ScratchDir dir;
    auto j = make(dir);
    j.erase("weight_map");
    write_index(dir, j);
    EXPECT_THAT(load_error(dir.str(), c), HasSubstr("no \"weight_map\""));
    std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": ";
    EXPECT_THAT(load_error(dir.str(), c), HasSubstr("not valid JSON"));
  }
}

TEST(Checkpoint, TiedEmbeddings) {
  const ModelConfig tied = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(tied);
  const Tensor a = initialized(tied, L);
  std::vector<std::vector<float>> keep;
  {
    // lm_head.weight present and equal to the embedding (some exporters write both): accepted.
    ScratchDir dir;
    save_checkpoint(dir.str(), tied, L, a);
    rewrite(dir.str(), [](std::vector<SafetensorsSource>& s) {
      SafetensorsSource head = s.front();
      for (const auto& x : s)
        if (x.name == "model.embed_tokens.weight") head = x;
      head.name = "lm_head.weight";
      s.push_back(head);
    }, keep);
    Tensor b = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
    const LoadSummary s = load_weights(dir.str(), tied, L, b);
    EXPECT_TRUE(s.tied_lm_head_in_file);
    EXPECT_TRUE(same_bytes(a, b));
  }
  {
    // Present and different: refused, saying what to change.
    ScratchDir dir;
    save_checkpoint(dir.str(), tied, L, a);
    std::vector<float> other(static_cast<std::size_t>(256 * 64), 0.5f);
    rewrite(dir.str(), [&](std::vector<SafetensorsSource>& s) {
      s.push_back({"lm_head.weight", {256, 64}, other.data(), DType::kF32, DType::kF32});
    }, keep);
    const std::string e = load_error(dir.str(), tied);
    EXPECT_THAT(e, HasSubstr("lm_head.weight"));
    EXPECT_THAT(e, HasSubstr("tie_word_embeddings"));
  }
  {
    // An untied config and a checkpoint without lm_head.weight.
    ScratchDir dir;
    save_checkpoint(dir.str(), tied, L, a);
    const std::string e = load_error(dir.str(), tiny_llama(false));
    EXPECT_THAT(e, HasSubstr("'lm_head.weight'"));
    EXPECT_THAT(e, HasSubstr("tie_word_embeddings"));
  }
  {
    // An untied checkpoint loaded with a tied config whose head differs: refused.
    const ModelConfig untied = tiny_llama(false);
    const ParamLayout U = ParamLayout::build(untied);
    ScratchDir dir;
    save_checkpoint(dir.str(), untied, U, initialized(untied, U));
    EXPECT_THAT(load_error(dir.str(), tied), HasSubstr("differs from model.embed_tokens.weight"));
  }
}

TEST(CheckpointBadInput, ShapesNotMatchingTheConfig) {
  const ModelConfig c = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(c);
  ScratchDir dir;
  save_checkpoint(dir.str(), c, L, initialized(c, L));
  ModelConfig other = c;
  other.intermediate_size = 96;
  other.name = dir / "config.json";
  const std::string e = load_error(dir.str(), other);
  EXPECT_THAT(e, HasSubstr("'model.layers.0.mlp.gate_proj.weight'"));
  EXPECT_THAT(e, HasSubstr("has shape [128, 64]"));
  EXPECT_THAT(e, HasSubstr("needs [96, 64]"));
  EXPECT_THAT(e, HasSubstr("intermediate_size 96"));
  EXPECT_THAT(e, HasSubstr(dir / "config.json"));
  EXPECT_THAT(e, HasSubstr("model.safetensors"));

  ModelConfig kv = c;
  kv.num_key_value_heads = 4;
  const std::string e2 = load_error(dir.str(), kv);
  EXPECT_THAT(e2, HasSubstr("'model.layers.0.self_attn.k_proj.weight' has shape [32, 64]"));
  EXPECT_THAT(e2, HasSubstr("needs [64, 64]"));
}

TEST(CheckpointBadInput, MissingAndExtraTensors) {
  const ModelConfig c = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(c);
  std::vector<std::vector<float>> keep;
  {
    ScratchDir dir;
    save_checkpoint(dir.str(), c, L, initialized(c, L));
    rewrite(dir.str(), [](std::vector<SafetensorsSource>& s) {
      std::erase_if(s, [](const SafetensorsSource& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; });
    }, keep);
    const std::string e = load_error(dir.str(), c);
    EXPECT_THAT(e, HasSubstr("lacks 1 tensor"));
    EXPECT_THAT(e, HasSubstr("'model.layers.1.mlp.up_proj.weight'"));
  }
  {
    // More layers in the file than in the config.
    ModelConfig deeper = c;
    deeper.num_hidden_layers = 3;
    const ParamLayout D = ParamLayout::build(deeper);
    ScratchDir dir;
    save_checkpoint(dir.str(), deeper, D, initialized(deeper, D));
    const std::string e = load_error(dir.str(), c);
    EXPECT_THAT(e, HasSubstr("9 tensor(s)"));
    EXPECT_THAT(e, HasSubstr("'model.layers.2."));
    EXPECT_THAT(e, HasSubstr("num_hidden_layers 2"));
  }
  {
    // A tensor of an unreadable dtype.
    ScratchDir dir;
    save_checkpoint(dir.str(), c, L, initialized(c, L));
    std::vector<std::int32_t> ints(64, 3);
    rewrite(dir.str(), [&](std::vector<SafetensorsSource>& s) {
      for (auto& x : s)
        if (x.name == "model.norm.weight") {
          x.data = ints.data();
          x.data_dtype = x.file_dtype = DType::kI32;
        }
    }, keep);
    const std::string e = load_error(dir.str(), c);
    EXPECT_THAT(e, HasSubstr("'model.norm.weight' has dtype I32"));
  }
}

TEST(Checkpoint, AcceptsBaseModelNamesAndIgnoresRotaryBuffers) {
  const ModelConfig c = tiny_llama(false);
  const ParamLayout L = ParamLayout::build(c);
  const Tensor a = initialized(c, L);
  ScratchDir dir;
  save_checkpoint(dir.str(), c, L, a);
  std::vector<std::vector<float>> keep;
  std::vector<float> inv(8, 1.0f);
  rewrite(dir.str(), [&](std::vector<SafetensorsSource>& s) {
    for (auto& x : s)
      if (x.name.starts_with("model.")) x.name = x.name.substr(6);  // as LlamaModel.save_pretrained writes
    s.push_back({"layers.0.self_attn.rotary_emb.inv_freq", {8}, inv.data(), DType::kF32, DType::kF32});
  }, keep);
  Tensor b = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
  const LoadSummary s = load_weights(dir.str(), c, L, b);
  EXPECT_TRUE(same_bytes(a, b));
  ASSERT_EQ(s.ignored.size(), 1u);
}

TEST(CheckpointBadInput, NoWeights) {
  ScratchDir dir;
  const ModelConfig c = tiny_llama(true);
  EXPECT_FALSE(has_weights(dir.str()));
  EXPECT_THAT(load_error(dir.str(), c), HasSubstr("has no model.safetensors or model.safetensors.index.json"));
  testing::write_bytes(dir / "pytorch_model.bin", {1, 2, 3});
  EXPECT_THAT(load_error(dir.str(), c), HasSubstr("PyTorch .bin weights only"));
  // A corrupt weight file names itself.
  testing::write_bytes(dir / "model.safetensors", {1, 2, 3});
  EXPECT_THAT(load_error(dir.str(), c), HasSubstr(dir / "model.safetensors"));
}

TEST(CheckpointBadInput, UnwritableSaveDirectory) {
  ScratchDir dir;
  const ModelConfig c = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(c);
  testing::write_bytes(dir / "file", {1});
  try {
    save_checkpoint(dir / "file/sub", c, L, initialized(c, L));
    ADD_FAILURE() << "saved under a regular file";
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr("file/sub"));
  }
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// The disk fills up while a checkpoint is saved over an earlier one (a file-size limit in a
// child process stands for it): the error says so, and the earlier checkpoint still loads.
TEST(CheckpointFaults, DiskFullWhileSavingKeepsTheEarlierCheckpoint) {
  ScratchDir dir;
  const ModelConfig c = tiny_llama(true);
  const ParamLayout L = ParamLayout::build(c);
  const Tensor first = initialized(c, L, DType::kF32, 1);
  save_checkpoint(dir.str(), c, L, first);
  const auto weights = fs::path(dir.str()) / "model.safetensors";
  const auto limit = static_cast<rlim_t>(fs::file_size(weights) / 2);
  const Tensor second = initialized(c, L, DType::kF32, 2);
  int pipe_fd[2];
  ASSERT_EQ(::pipe(pipe_fd), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fd[0]);
    struct rlimit rl {limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    ::signal(SIGXFSZ, SIG_IGN);
    std::string msg = "saved without an error";
    try {
      save_checkpoint(dir.str(), c, L, second);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    (void)!::write(pipe_fd[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(pipe_fd[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fd[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_THAT(msg, HasSubstr(weights.string()));
  EXPECT_THAT(msg, HasSubstr("File too large"));
  EXPECT_THAT(msg, HasSubstr("disk"));
  EXPECT_FALSE(fs::exists(weights.string() + ".tmp"));
  Tensor back = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(dir.str(), c, L, back);
  EXPECT_TRUE(same_bytes(back, first));
}

}  // namespace
}  // namespace scalelab
