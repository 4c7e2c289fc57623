#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/parallel.h"
#include "model/config.h"
#include "train/memory_plan.h"

namespace scalelab {
namespace {

TrainOptions tiny() {
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.max_steps = 4;
  o.lr = 1e-3;
  o.quiet = true;
  o.threads = 2;
  return o;
}

TEST(Trainer, SameSeedSameLossesBitForBit) {
  TrainOptions o = tiny();
  const TrainResult a = run_training(o), b = run_training(o);
  ASSERT_EQ(a.status, RunStatus::kOk);
  ASSERT_EQ(a.steps.size(), 4u);
  for (std::size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << i;
  o.seed = 43;
  const TrainResult c = run_training(o);
  EXPECT_NE(a.steps[0].loss, c.steps[0].loss);
}

TEST(Trainer, GradientAccumulationMatchesTheLargerBatch) {
  TrainOptions big = tiny();
  big.micro_batch_size = 4;
  TrainOptions acc = tiny();
  acc.micro_batch_size = 2;
  acc.grad_accum_steps = 2;
  const TrainResult a = run_training(big), b = run_training(acc);
  // Not bit for bit: the batch of 4 and the two of 2 go through OpenBLAS with other row counts
  // (its kernels and blocking are chosen per CPU) and the loss is a sum in another order. A sum of
  // n = 64 positive per-token losses in fp32 is off by at most n * 2^-24 < 4e-6 relative, plus a
  // few ulps inside each row: 1e-5 relative holds on any CPU (an absolute 2e-5 was ~3.6e-6
  // relative at this loss, under that bound). Later steps also carry AdamW's amplification of
  // rounding in elements whose gradient is at rounding level, which moves the loss and the
  // norm only at second order (tests/distributed/train_mpi_test.cpp derives the bound on the weights).
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, 1e-5 * std::fabs(a.steps[i].loss)) << i;
    EXPECT_NEAR(a.steps[i].grad_norm, b.steps[i].grad_norm, 1e-4 * a.steps[i].grad_norm) << i;
  }
}

TEST(Trainer, LearnsAPeriodicTokenFile) {
  // A token file repeating 0..16: next-token prediction is learnable, so the loss must fall.
  const std::string path = testing::TempDir() + "periodic_tokens.bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (std::uint32_t i = 0; i < 17 * 64; ++i) {
      const std::uint32_t t = i % 17;
      out.write(reinterpret_cast<const char*>(&t), 4);
    }
  }
  TrainOptions o = tiny();
  o.max_steps = 30;
  o.lr = 3e-3;
  o.lr_scheduler = "constant";
  o.data = path;
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.status, RunStatus::kOk);
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss - 0.3);
}

TEST(Trainer, WarmupStartsAtZeroLr) {
  TrainOptions o = tiny();
  o.warmup_steps = 2;
  const TrainResult r = run_training(o);
  EXPECT_EQ(r.steps[0].lr, 0.0);
  EXPECT_DOUBLE_EQ(r.steps[1].lr, 0.5e-3);
  EXPECT_DOUBLE_EQ(r.steps[2].lr, 1e-3);
}

TEST(Trainer, OutOfMemoryIsAResultNotACrash) {
  TrainOptions o = tiny();
  o.device_memory = "300KiB";
  const TrainResult r = run_training(o);
  EXPECT_EQ(r.status, RunStatus::kOom);
  EXPECT_GT(r.oom["requested_bytes"].get<std::size_t>(), 0u);
  EXPECT_EQ(r.oom["capacity_bytes"].get<std::size_t>(), 300u * 1024);
  EXPECT_FALSE(r.plan["fits"].get<bool>());
  EXPECT_LE(r.max_reserved_bytes, 300u * 1024);
}

TEST(Trainer, RecordHasTheContractFields) {
  const TrainResult r = run_training(tiny());
  const auto j = r.to_json();
  for (const char* k : {"status", "config", "params", "flops_per_token", "tokens_per_s", "tokens_per_s_per_device",
                        "step_time_s", "max_allocated_bytes", "max_reserved_bytes", "losses", "final_loss", "mfu",
                        "error"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["losses"].size(), 4u);
  EXPECT_TRUE(j["mfu"].is_null());
  EXPECT_EQ(j["config"]["micro_batch_size"], 2);
  EXPECT_EQ(j["measured_steps"], 2);  // 4 steps minus 2 warm-up steps
}

TEST(Trainer, InvalidOptionsNameTheFlag) {
  auto expect_flag = [](TrainOptions o, const char* flag) {
    try {
      run_training(o);
      FAIL() << flag;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  TrainOptions o = tiny();
  o.seq_len = 0;
  expect_flag(o, "--seq-len");
  o = tiny();
  o.micro_batch_size = -1;
  expect_flag(o, "--micro-batch-size");
  o = tiny();
  o.seq_len = 100000;
  expect_flag(o, "max_position_embeddings");
  o = tiny();
  o.lr_scheduler = "bogus";
  expect_flag(o, "--lr-scheduler");
  o = tiny();
  o.model = "gpt-5";
  expect_flag(o, "unknown model preset");
}

// The plan predicts the measured peak reserved memory within 10% for several configurations.
TEST(MemoryPlan, PredictsMeasuredPeakWithin10Percent) {
  struct Case {
    std::string model;
    std::int64_t mb, seq;
    bool ckpt;
    std::string model_precision = "fp32", mixed = "no", optim = "auto";
    std::string attn = "eager";
    bool fused = false;
  };
  for (const Case& c : {Case{"llama-tiny", 2, 64, false}, Case{"llama-tiny", 8, 128, false},
                        Case{"llama-tiny", 4, 128, true}, Case{"llama-tiny", 4, 96, false, "fp32", "bf16"},
                        Case{"llama-tiny", 4, 96, true, "fp32", "fp16"}, Case{"llama-tiny", 6, 64, false, "bf16"},
                        Case{"llama-tiny", 6, 64, false, "bf16", "no", "fp32"},
                        Case{"llama-tiny", 4, 128, false, "fp32", "no", "auto", "flash"},
                        Case{"llama-tiny", 4, 128, false, "fp32", "no", "auto", "eager", true},
                        Case{"llama-tiny", 8, 96, false, "bf16", "no", "auto", "flash", true},
                        Case{"llama-tiny", 3, 200, true, "fp32", "fp16", "auto", "flash", true}}) {
    TrainOptions o = tiny();
    o.model = c.model;
    o.micro_batch_size = c.mb;
    o.seq_len = c.seq;
    o.activation_checkpointing = c.ckpt;
    o.model_precision = c.model_precision;
    o.mixed_precision = c.mixed;
    o.optim_state_dtype = c.optim;
    o.attn = c.attn;
    o.fused_kernels = c.fused;
    o.max_steps = 2;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.status, RunStatus::kOk);
    const double planned = r.plan["total_bytes"].get<double>();
    const double measured = static_cast<double>(r.max_reserved_bytes);
    EXPECT_NEAR(measured / planned, 1.0, 0.10) << c.model << " mb " << c.mb << " seq " << c.seq << " ckpt " << c.ckpt
                                               << " " << c.model_precision << "/" << c.mixed << " " << c.attn
                                               << (c.fused ? " fused" : "")
                                               << ": planned " << planned << " measured " << measured;
  }
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// Low precision halves what it should: bf16 weights/gradients/states and activations.
TEST(MemoryPlan, Bf16HalvesWeightAndActivationBytes) {
  TrainOptions o = tiny();
  o.max_steps = 1;
  const TrainResult f = run_training(o);
  o.model_precision = "bf16";
  const TrainResult b = run_training(o);
  auto item = [](const TrainResult& r, const char* name) {
    for (const auto& it : r.plan["items"])
      if (it["name"] == name) return it["bytes"].get<double>();
    return 0.0;
  };
  EXPECT_NEAR(item(b, "weights") / item(f, "weights"), 0.5, 0.01);
  EXPECT_NEAR(item(b, "gradients") / item(f, "gradients"), 0.5, 0.01);
  EXPECT_NEAR(item(b, "optimizer states") / item(f, "optimizer states"), 0.5, 0.01);
  EXPECT_LT(b.max_allocated_bytes, 0.6 * static_cast<double>(f.max_allocated_bytes));
  EXPECT_EQ(b.precision["adamw"]["rounding"], "stochastic");
}

TEST(Precision, RefusesCombinationsThatCannotWork) {
  TrainOptions o = tiny();
  o.model_precision = "bf16";
  o.mixed_precision = "fp16";
  EXPECT_THROW(run_training(o), InvalidInput);
  o = tiny();
  o.optim_state_dtype = "fp8";
  EXPECT_THROW(run_training(o), InvalidInput);
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// The rungs' physics in the plan: flash removes the S×S scores, fused kernels remove the logits.
TEST(MemoryPlan, FlashRemovesScoresAndFusedRemovesLogits) {
  TrainOptions o = tiny();
  o.max_steps = 1;
  o.seq_len = 256;
  auto plan_items = [](const TrainOptions& opt) {
    std::map<std::string, double> m;
    const nlohmann::json plan = plan_memory(make_plan_input(opt)).to_json();
    for (const auto& it : plan["items"]) m[it["name"].get<std::string>()] = it["bytes"].get<double>();
    return m;
  };
  const auto eager = plan_items(o);
  EXPECT_GT(eager.at("attention scores"), 0);
  EXPECT_GT(eager.at("logits"), 0);
  o.attn = "flash";
  const auto flash = plan_items(o);
  EXPECT_EQ(flash.count("attention scores"), 0u);
  o.fused_kernels = true;
  const auto fused = plan_items(o);
  EXPECT_EQ(fused.count("logits"), 0u);
  EXPECT_GT(fused.at("fused loss chunk"), 0);
  EXPECT_LT(fused.at("activations"), flash.at("activations"));  // norm outputs and MLP activation not kept
}

// --fused-loss-chunk sizes the fused loss's [chunk, vocab] fp32 scratch: the plan item is that
// block, the run allocates what the plan says (measured peak == planned total), and the losses
// stay those of the default chunk up to summation order. Misuse is refused before anything runs.
TEST(MemoryPlan, FusedLossChunkSizesTheLossScratchInThePlanAndTheRun) {
  TrainOptions o = tiny();
  o.max_steps = 2;
  o.seq_len = 64;
  o.micro_batch_size = 4;  // 256 tokens: the default chunk holds them all
  o.fused_kernels = true;
  const std::int64_t V = resolve_model(o.model).vocab_size;
  auto chunk_item = [](const TrainResult& r) {
    for (const auto& it : r.plan["items"])
      if (it["name"] == "fused loss chunk") return it["bytes"].get<std::size_t>();
    return std::size_t{0};
  };
  const TrainResult def = run_training(o);
  o.fused_loss_chunk = 32;
  const TrainResult small = run_training(o);
  ASSERT_EQ(def.status, RunStatus::kOk);
  ASSERT_EQ(small.status, RunStatus::kOk);
  EXPECT_EQ(chunk_item(def), DeviceAllocator::round_size(static_cast<std::size_t>(256 * V) * sizeof(float)));
  EXPECT_EQ(chunk_item(small), DeviceAllocator::round_size(static_cast<std::size_t>(32 * V) * sizeof(float)));
  for (const auto& it : small.plan["items"])  // the plan says which chunk it planned
    if (it["name"] == "fused loss chunk") {
      EXPECT_NE(it["detail"].get<std::string>().find("32 of the 256 tokens"), std::string::npos) << it;
    }
  EXPECT_EQ(small.plan["total_bytes"].get<std::size_t>(), small.max_reserved_bytes);
  EXPECT_EQ(def.plan["total_bytes"].get<std::size_t>(), def.max_reserved_bytes);
  // Step 0 runs on the same weights: its loss is a sum of the same per-token terms in another
  // grouping (fp32, 256 terms of size ~log V: far below 1e-5 relative).
  ASSERT_EQ(small.steps.size(), 2u);
  EXPECT_NEAR(small.steps[0].loss, def.steps[0].loss, 1e-5 * def.steps[0].loss);
  EXPECT_EQ(small.to_json()["config"]["fused_loss_chunk"], 32);
  EXPECT_FALSE(def.to_json()["config"].contains("fused_loss_chunk"));

  o.fused_loss_chunk = -1;
  EXPECT_THROW(run_training(o), InvalidInput);
  o.fused_loss_chunk = 64;
  o.fused_kernels = false;
  EXPECT_THROW(run_training(o), InvalidInput);
}

}  // namespace
}  // namespace scalelab
