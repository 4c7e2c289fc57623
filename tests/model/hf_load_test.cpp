// What scalelab saves loads in Hugging Face transformers and computes the same logits.
// Runs tests/golden/check_hf_load.py with the golden virtualenv's interpreter
// ($SCALELAB_GOLDEN_PYTHON, else <repo>/.venv-golden/bin/python, made by `make golden`);
// skipped, with a message, where torch + transformers are not installed (CI needs neither).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>

#include "model/checkpoint.h"
#include "model/init.h"
#include "model_test_util.h"

namespace scalelab {
namespace {

using testing::golden_dir;
using testing::host_alloc;

std::string golden_python() {
  if (const char* p = std::getenv("SCALELAB_GOLDEN_PYTHON"); p != nullptr && *p != '\0') return p;
  return std::string(SCALELAB_SOURCE_DIR) + "/.venv-golden/bin/python";
}

// Runs a shell command; returns its exit status and output (stdout + stderr).
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  std::FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

class HfLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = golden_python();
    if (!std::filesystem::exists(python_)) {
      GTEST_SKIP() << "no golden Python at " << python_ << " (torch + transformers); run `make golden` to create it";
    }
    const auto [rc, out] = run(quote(python_) + " -c 'import torch, transformers'");
    if (rc != 0) GTEST_SKIP() << python_ << " cannot import torch and transformers: " << out;
  }
  std::string python_;
};

Tensor load_golden(const std::string& name, ModelConfig& c, ParamLayout& L) {
  c = load_config_dir(golden_dir(name));
  L = ParamLayout::build(c);
  Tensor t = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  load_weights(golden_dir(name), c, L, t);
  return t;
}

TEST_F(HfLoad, TransformersLoadsWhatScalelabSaves) {
  testing::ScratchDir dir;
  nlohmann::json checks = nlohmann::json::array();
  auto check = [&](const std::string& model, const std::string& golden, nlohmann::json extra) {
    nlohmann::json c = {{"model", model},
                        {"tokens", golden_dir(golden) + "/tokens.bin"},
                        {"seq_len", 16},
                        {"num_samples", 2}};
    if (extra.is_object()) c.update(extra);
    checks.push_back(c);
  };
  ModelConfig c;
  ParamLayout L;
  {
    // Llama, tied, rope scaling: fp32 in 40 KB shards; the logits are the golden ones.
    const Tensor t = load_golden("llama_gqa_tied_rope3", c, L);
    save_checkpoint(dir / "llama_f32_sharded", c, L, t, {DType::kF32, 40000});
    check(dir / "llama_f32_sharded", "llama_gqa_tied_rope3",
          {{"expected_logits", golden_dir("llama_gqa_tied_rope3") + "/expected.safetensors"}, {"atol", 1e-5}});
    // bf16: exactly the logits of the golden model with its weights rounded by torch.
    save_checkpoint(dir / "llama_bf16", c, L, t, {DType::kBF16, 0});
    check(dir / "llama_bf16", "llama_gqa_tied_rope3",
          {{"reference_model", golden_dir("llama_gqa_tied_rope3")}, {"reference_dtype", "bfloat16"}, {"atol", 0.0}});
  }
  {
    // OPT with project_in/out and post-LN, untied Llama: fp32, one file.
    const Tensor t = load_golden("opt_proj_postln_accum2", c, L);
    save_checkpoint(dir / "opt_proj", c, L, t);
    check(dir / "opt_proj", "opt_proj_postln_accum2",
          {{"expected_logits", golden_dir("opt_proj_postln_accum2") + "/expected.safetensors"}, {"atol", 1e-5}});
    const Tensor u = load_golden("llama_untied_accum2", c, L);
    save_checkpoint(dir / "llama_untied", c, L, u);
    check(dir / "llama_untied", "llama_untied_accum2",
          {{"expected_logits", golden_dir("llama_untied_accum2") + "/expected.safetensors"}, {"atol", 1e-5}});
  }
  {
    // A fresh scalelab model from a preset (config.json written by to_hf_json): loads cleanly.
    c = preset_config("opt-tiny");
    L = ParamLayout::build(c);
    Tensor t = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
    init_params(t, L, c, 3);
    save_checkpoint(dir / "opt_tiny_init", c, L, t);
    check(dir / "opt_tiny_init", "opt_tiny", nlohmann::json::object());
    c = preset_config("llama-tiny");
    L = ParamLayout::build(c);
    Tensor u = Tensor::empty({L.total_numel()}, DType::kBF16, host_alloc());
    init_params(u, L, c, 3);
    save_checkpoint(dir / "llama_tiny_init", c, L, u, {DType::kBF16, 0});
    check(dir / "llama_tiny_init", "llama_gqa_tied_rope3", nlohmann::json::object());
  }
  std::ofstream(dir / "checks.json") << checks.dump(1);
  const auto [rc, out] = run(quote(python_) + " " + quote(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/check_hf_load.py") +
                             " --spec " + quote(dir / "checks.json"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("6 of 6 checks passed"), std::string::npos) << out;
}

// Qwen2: the golden model saved by scalelab (fp32 sharded: the golden logits; bf16: the golden
// model's logits with its weights rounded), and a fresh qwen2-tiny from its preset's config.json.
TEST_F(HfLoad, TransformersLoadsWhatScalelabSavesForQwen2) {
  testing::ScratchDir dir;
  const std::string golden = "qwen2_gqa_tied_bias_accum2";
  nlohmann::json base = {{"tokens", golden_dir(golden) + "/tokens.bin"}, {"seq_len", 16}, {"num_samples", 2}};
  nlohmann::json checks = nlohmann::json::array();
  ModelConfig c;
  ParamLayout L;
  const Tensor t = load_golden(golden, c, L);
  save_checkpoint(dir / "qwen2_f32_sharded", c, L, t, {DType::kF32, 40000});
  nlohmann::json a = base;
  a.update({{"model", dir / "qwen2_f32_sharded"},
            {"expected_logits", golden_dir(golden) + "/expected.safetensors"},
            {"atol", 1e-5}});
  checks.push_back(a);
  save_checkpoint(dir / "qwen2_bf16", c, L, t, {DType::kBF16, 0});
  nlohmann::json b = base;
  b.update({{"model", dir / "qwen2_bf16"}, {"reference_model", golden_dir(golden)}, {"reference_dtype", "bfloat16"},
            {"atol", 0.0}});
  checks.push_back(b);
  c = preset_config("qwen2-tiny");
  L = ParamLayout::build(c);
  Tensor u = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  init_params(u, L, c, 3);
  save_checkpoint(dir / "qwen2_tiny_init", c, L, u);
  nlohmann::json i = base;
  i["model"] = dir / "qwen2_tiny_init";
  checks.push_back(i);
  std::ofstream(dir / "checks.json") << checks.dump(1);
  const auto [rc, out] = run(quote(python_) + " " + quote(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/check_hf_load.py") +
                             " --spec " + quote(dir / "checks.json"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("3 of 3 checks passed"), std::string::npos) << out;
}

}  // namespace
}  // namespace scalelab
