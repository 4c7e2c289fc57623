// The memory plan of the OPT family against measured peaks: the plan replays src/model/opt.cpp's
// allocations (src/train/memory_plan.cpp opt_step), so the prediction is exact; the issue asks for
// 10%, which every case also meets. Configurations cover pre-LN (opt-tiny) and a post-LN model
// with project_in/out (opt-350m-like, made small), eager/flash, fused/unfused, checkpointing,
// dropout, and every precision mode.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/config.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

struct Case {
  std::string model;
  std::int64_t mb, seq;
  std::string attn = "eager";
  bool fused = false, ckpt = false;
  double dropout = -1;
  std::string model_precision = "fp32", mixed = "no";
};

std::string describe(const Case& c) {
  return c.model + " mb " + std::to_string(c.mb) + " seq " + std::to_string(c.seq) + " " + c.attn +
         (c.fused ? " fused" : "") + (c.ckpt ? " ckpt" : "") + " dropout " + std::to_string(c.dropout) + " " +
         c.model_precision + "/" + c.mixed;
}

TEST(OptMemoryPlan, PredictsMeasuredPeakExactly) {
  // opt-350m's shape in small: word_embed_proj_dim != hidden_size and post-LN.
  const std::string postln = testing::TempDir() + "opt_plan_postln";
  std::filesystem::create_directories(postln);
  {
    ModelConfig c = preset_config("opt-tiny");
    c.word_embed_proj_dim = 32;
    c.do_layer_norm_before = false;
    c.dropout = 0.1;
    std::ofstream(postln + "/config.json") << c.to_hf_json().dump(2);
  }
  // Post-LN without projections, biases or LayerNorm affine (the head reads the last layer's output).
  const std::string bare = testing::TempDir() + "opt_plan_postln_bare";
  std::filesystem::create_directories(bare);
  {
    ModelConfig c = preset_config("opt-tiny");
    c.do_layer_norm_before = false;
    c.enable_bias = false;
    c.layer_norm_elementwise_affine = false;
    std::ofstream(bare + "/config.json") << c.to_hf_json().dump(2);
  }
  const std::vector<Case> cases = {
      {bare, 4, 64, "eager", true, false, 0.1},
      {bare, 4, 64, "flash", false, true, -1, "fp32", "bf16"},
      {"opt-tiny", 4, 128},
      {"opt-tiny", 4, 128, "flash"},
      {"opt-tiny", 4, 128, "eager", true},
      {"opt-tiny", 4, 128, "eager", false, true, 0.1},
      {"opt-tiny", 4, 96, "flash", true, true, 0.1, "fp32", "bf16"},
      {"opt-tiny", 6, 64, "eager", true, false, -1, "bf16"},
      {"opt-tiny", 6, 64, "eager", false, false, 0.2, "fp32", "fp16"},
      {postln, 4, 128},
      {postln, 4, 128, "flash", true},
      {postln, 4, 96, "eager", true, true, -1, "bf16"},
      {postln, 4, 96, "flash", false, true, 0.0, "fp32", "bf16"},
  };
  for (const Case& c : cases) {
    TrainOptions o;
    o.model = c.model;
    o.micro_batch_size = c.mb;
    o.seq_len = c.seq;
    o.attn = c.attn;
    o.fused_kernels = c.fused;
    o.activation_checkpointing = c.ckpt;
    o.dropout = c.dropout;
    o.model_precision = c.model_precision;
    o.mixed_precision = c.mixed;
    o.max_steps = 2;
    o.threads = 2;
    o.quiet = true;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.status, RunStatus::kOk) << describe(c) << ": " << r.error;
    const double planned = r.plan["total_bytes"].get<double>();
    const double measured = static_cast<double>(r.max_reserved_bytes);
    EXPECT_NEAR(measured / planned, 1.0, 0.10) << describe(c);
    EXPECT_EQ(measured, planned) << describe(c) << ": the plan mirrors the engine's allocations";
  }
}

TEST(OptMemoryPlan, RungsShrinkWhatThePhysicsSays) {
  // opt-small at seq 512 (planned only): flash removes the S×S scores, fused kernels the logits,
  // bf16 weights halve weights and gradients.
  TrainOptions o;
  o.model = "opt-small";
  o.seq_len = 512;
  o.micro_batch_size = 4;
  o.threads = 2;
  auto plan = [&](const TrainOptions& t) { return plan_memory(make_plan_input(t)).to_json(); };
  auto item = [](const nlohmann::json& p, const char* name) {
    for (const auto& it : p["items"])
      if (it["name"] == name) return it["bytes"].get<double>();
    return 0.0;
  };
  const auto base = plan(o);
  TrainOptions f = o;
  f.attn = "flash";
  const auto flash = plan(f);
  EXPECT_GT(item(base, "attention scores"), 0.0);
  EXPECT_EQ(item(flash, "attention scores"), 0.0);
  EXPECT_LT(flash["total_bytes"].get<double>(), base["total_bytes"].get<double>());
  f.fused_kernels = true;
  const auto fused = plan(f);
  // The [tokens, vocab] fp32 logits (2048 x 32768 x 4 = 256 MiB) stay reserved (live or cached)
  // through backward without fused kernels; the fused loss needs one chunk.
  const double logits = 2048.0 * 32768 * 4;
  EXPECT_GT(flash["total_bytes"].get<double>() - fused["total_bytes"].get<double>(), 0.75 * logits);
  f.model_precision = "bf16";
  const auto bf16 = plan(f);
  EXPECT_NEAR(item(bf16, "weights") / item(fused, "weights"), 0.5, 0.01);
  EXPECT_NEAR(item(bf16, "gradients") / item(fused, "gradients"), 0.5, 0.01);
  // The largest micro-batch grows along the rungs under the same cap.
  o.device_memory = f.device_memory = "3GiB";
  TrainOptions b = o;
  std::int64_t prev = plan(b)["max_micro_batch_size"].get<std::int64_t>();
  EXPECT_GT(prev, 0);
  b.attn = "flash";
  for (int rung = 0; rung < 2; ++rung) {
    const std::int64_t mb = plan(b)["max_micro_batch_size"].get<std::int64_t>();
    EXPECT_GT(mb, prev) << "rung " << rung;
    prev = mb;
    b.fused_kernels = true;
  }
}

}  // namespace
}  // namespace scalelab
