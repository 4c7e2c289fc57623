// Every fine-tuning method on the test device against the CPU: with SCALELAB_TEST_DEVICE=cuda
// (model_test_util.h) each method trains a tiny model for 4 optimizer steps twice, in this process,
// on the CPU and on the device, from the same seed (the same host initialization, adapters
// included), the same data and the same flags, and the per-step losses, gradient norms and (DPO)
// rewards must agree. On the CPU alone (the default) the tests skip: comparing the CPU with
// itself says nothing about a device.
//
// Methods: full fine-tuning; LoRA on all seven Llama projections (with dropout, and with
// --fused-kernels: the chunked linear + cross-entropy with the frozen LM head); QLoRA with the base
// in NF4, both flavours (nf4 = torchao's, nf4-bnb = bitsandbytes'); QAT 8da4w, alone and with LoRA;
// DPO with LoRA (the reference = the adapters off) and full (the reference = a frozen copy), with
// the held-out pairs' evaluation; full fine-tuning with a frozen prefix (--freeze: backward stops
// above it) and with --optimizer-in-backward. OPT (biases, LayerNorm, ReLU, learned positions) for
// each method it supports. Checkpoints written on the device (DPO full and LoRA, QLoRA) resume
// there and continue the CPU's uninterrupted run.
//
// Tolerances, relative (fp32 storage and compute everywhere; no TF32: --allow-tf32 is off):
//   kSameMath 1e-4. The two sides run the same operations in fp32; only the order of the sums
//     differs (cuBLASLt's and the CUDA reductions' against OpenBLAS's and the CPU's). A dot
//     product of length K ≤ 256 (these models' widths and the rows of a micro-batch) then differs
//     by about √K·2^-24 ≈ 1e-6 relative, and so does the first step's loss (a mean of per-token
//     terms of order ln V, computed from the same weights). AdamW's update m̂/(√v̂ + ε) is
//     insensitive to a relative error of the gradient (steps 1-4 move each weight by about ±lr
//     whatever the gradient's size), so the weights after an update differ by the rounding of the
//     update itself, and later losses differ by a few 1e-6 too. Clipping scales by the gradient
//     norm, known to the same ~1e-6. 1e-4 leaves a factor of ~30 for the accumulation over 4 steps
//     and the longest sums, and is still far below what a wrong kernel does (a wrong element of a
//     weight, a mask bit or an NF4 block changes these losses by 1e-3 or more).
//   kQuantized 1e-3 (QAT). Fake quantization rounds to a grid (a step of 1/255 of a row's range for
//     activations, amax/7.5 for weight groups): an input that differs by an ulp (the sums above)
//     and lies within that ulp of a rounding boundary moves by a whole step on one side only. About
//     one activation in 10^4 does (2·1e-6·255/2), so each step has a few such moves per layer,
//     each changing the loss by at most its gradient times one step (~1e-5 relative here). The
//     kernels themselves are bit-identical to the CPU's (selftest family "qat").
//   kQuantizedTrained 1e-2 (QAT of trained weights, from step 2 on). After the first update the
//     weights themselves differ by about an ulp between the sides (the update's rounding of a
//     gradient that differs by ~1e-6), and the int4 weight grid is coarse: a step is amax/7.5 of
//     the group, about 13 % of its largest weight. A weight within an ulp of a boundary moves by
//     that step on one side only; these models have ~10^5 quantized weights and 15 boundaries per
//     group range, so a step or two has such a move, and each shifts the loss and the gradient norm
//     by up to a few 1e-3 (the first H100 run measured 1.1e-3 to 3.5e-3 on the gradient norm at
//     steps 2-4, losses within 1e-3; step 1, with identical weights, within 1e-3). QAT + LoRA keeps
//     the base frozen (identical quantized weights) and stays at kQuantized.
//   Rewards (DPO), absolute: β·(policy − reference), each a sum of log-probabilities over at most
//     seq_len completion tokens. A log-probability logit − lse (lse ≈ ln V ≈ 7, ulp 5e-7) differs
//     by about 1e-6 between the sides (the logits' sums above); allowing δ = tolerance / 10 per
//     token (1e-5, 10x that; 1e-4 under QAT) gives |Δreward| ≤ β·2·seq_len·δ (6.4e-5 here, while
//     the rewards of these runs reach 1e-3 to 2e-2). At the first step both are exactly 0 (the
//     policy equals its reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

constexpr double kSameMath = 1e-4;
constexpr double kQuantized = 1e-3;
constexpr double kQuantizedTrained = 1e-2;

const char* const kLlamaTargets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
const char* const kOptTargets = "q_proj,k_proj,v_proj,out_proj,fc1,fc2";

struct Method {
  std::string name;
  std::function<void(TrainOptions&)> apply;
  double tol = kSameMath;
  double tol_after_update = -1;  // >= 0: the tolerance from step 2 on (after the first update)
};

TrainOptions tiny(const std::string& model) {
  TrainOptions o;
  o.model = model;
  o.seq_len = 32;
  o.micro_batch_size = 2;
  o.grad_accum_steps = 1;
  o.max_steps = 4;
  o.warmup_steps = 0;
  o.lr = 1e-3;
  o.lr_scheduler = "constant";
  o.weight_decay = 0.01;
  o.max_grad_norm = 1.0;
  o.seed = 7;
  o.threads = 2;
  o.quiet = true;
  o.bench_warmup_steps = 0;
  return o;
}

void lora(TrainOptions& o, const char* targets, double dropout = 0.0) {
  o.lora_rank = 8;
  o.lora_alpha = 16;
  o.lora_targets = targets;
  o.lora_dropout = dropout;
}

void dpo(TrainOptions& o, const std::string& dir) {
  o.model = dir;
  o.dpo.enabled = true;
  o.dpo.pairs = dir + "/pairs.jsonl";
  o.dpo.beta = 0.1;
  // The held-out pairs, where the golden has them: evaluated after steps 2 and 4.
  if (std::filesystem::exists(dir + "/pairs_val.jsonl")) {
    o.val_data = dir + "/pairs_val.jsonl";
    o.eval_every = 2;
  }
}

// Everything below the first layer frozen: backward stops at layer 1 (no activations kept below).
void freeze_prefix(TrainOptions& o, const char* embeddings) {
  o.freeze = std::string(embeddings) + "|layers\\.0\\.";
}

void optimizer_in_backward(TrainOptions& o) {
  o.optimizer_in_backward = true;
  o.max_grad_norm = 0;  // clipping needs the whole gradient first: refused with it
}

// The device the methods run on besides the CPU (SCALELAB_TEST_DEVICE); the CPU: skip.
DeviceType device_under_test() { return testing::test_device(); }

// Compares the device's steps with the CPU's, the device's first step being the CPU's
// cpu.steps[offset] (a resumed run holds only the steps after its checkpoint), and the
// evaluations that both ran after the same optimizer step.
void expect_same_steps(const TrainOptions& o, const Method& m, const TrainResult& cpu, const TrainResult& dev,
                       std::size_t offset = 0) {
  ASSERT_EQ(cpu.status, RunStatus::kOk) << "cpu: " << cpu.error;
  ASSERT_EQ(dev.status, RunStatus::kOk) << o.device << ": " << dev.error;
  ASSERT_EQ(cpu.steps.size(), static_cast<std::size_t>(o.max_steps));
  ASSERT_EQ(dev.steps.size() + offset, cpu.steps.size());
  const double reward_tol = o.dpo.beta * 2.0 * static_cast<double>(o.seq_len) * (m.tol / 10);
  for (std::size_t j = 0; j < dev.steps.size(); ++j) {
    const std::size_t i = j + offset;
    const StepRecord &c = cpu.steps[i], &d = dev.steps[j];
    EXPECT_TRUE(std::isfinite(d.loss)) << "step " << i + 1;
    const double tol = (i > 0 && m.tol_after_update >= 0) ? m.tol_after_update : m.tol;
    EXPECT_NEAR(d.loss, c.loss, tol * std::fabs(c.loss)) << "loss, step " << i + 1;
    EXPECT_NEAR(d.grad_norm, c.grad_norm, tol * std::fabs(c.grad_norm)) << "gradient norm, step " << i + 1;
    ASSERT_EQ(c.dpo.has_value(), o.dpo.enabled);
    ASSERT_EQ(d.dpo.has_value(), o.dpo.enabled);
    if (o.dpo.enabled) {
      EXPECT_NEAR(d.dpo->rewards_chosen, c.dpo->rewards_chosen, reward_tol) << "rewards (chosen), step " << i + 1;
      EXPECT_NEAR(d.dpo->rewards_rejected, c.dpo->rewards_rejected, reward_tol)
          << "rewards (rejected), step " << i + 1;
    }
  }
  // Evaluations: the device's are those of the CPU at the same step (a resumed run skips the
  // earlier ones). The loss is a mean over the held-out set of the same per-token (per-pair) terms
  // as a training step's, so the same tolerance holds; the DPO rewards are sums as in training.
  std::size_t matched = 0;
  for (const EvalRecord& d : dev.evals) {
    const auto c = std::find_if(cpu.evals.begin(), cpu.evals.end(), [&](const EvalRecord& e) { return e.step == d.step; });
    ASSERT_NE(c, cpu.evals.end()) << "the device evaluated after step " << d.step << ", the CPU did not";
    ++matched;
    const double tol = m.tol_after_update >= 0 ? m.tol_after_update : m.tol;
    EXPECT_TRUE(std::isfinite(d.loss)) << "evaluation after step " << d.step;
    EXPECT_NEAR(d.loss, c->loss, tol * std::fabs(c->loss)) << "evaluation loss after step " << d.step;
    EXPECT_EQ(d.tokens, c->tokens) << "evaluation after step " << d.step;
    ASSERT_EQ(d.dpo.has_value(), c->dpo.has_value());
    if (d.dpo) {
      EXPECT_NEAR(d.dpo->rewards_chosen, c->dpo->rewards_chosen, reward_tol) << "eval rewards (chosen), step " << d.step;
      EXPECT_NEAR(d.dpo->rewards_rejected, c->dpo->rewards_rejected, reward_tol)
          << "eval rewards (rejected), step " << d.step;
    }
  }
  if (offset == 0) {
    EXPECT_EQ(matched, cpu.evals.size()) << "the CPU ran evaluations the device did not";
  }
  if (!o.val_data.empty()) {
    EXPECT_GT(matched, 0u) << "--val-data was given but the device evaluated nothing";
  }
}

// Runs `m` on the CPU and on the test device and compares the runs step by step.
void expect_same_run_on_both(const TrainOptions& base, const Method& m) {
  TrainOptions o = base;
  m.apply(o);
  SCOPED_TRACE(m.name + " (" + o.model + ")");
  o.device = "cpu";
  const TrainResult cpu = run_training(o);
  o.device = device_type_name(device_under_test());
  const TrainResult dev = run_training(o);
  expect_same_steps(o, m, cpu, dev);
}

// Runs `m` on the device with a checkpoint after step 2, resumes it there from that checkpoint,
// and compares the resumed steps 3-4 (and the evaluation after step 4) with the CPU's
// uninterrupted run: the checkpoint (weights or adapters, AdamW's state, the NF4 store's host copy,
// DPO's reference checksum, the data position) must carry everything the device's run needs.
void expect_device_checkpoint_resumes(const TrainOptions& base, const Method& m, const std::string& name) {
  TrainOptions o = base;
  m.apply(o);
  SCOPED_TRACE(m.name + ", resumed on the device (" + o.model + ")");
  o.device = "cpu";
  const TrainResult cpu = run_training(o);
  const std::string dir = ::testing::TempDir() + "finetune_device_resume_" + name;
  std::filesystem::remove_all(dir);
  o.device = device_type_name(device_under_test());
  o.save = dir;
  o.save_every = 2;
  const TrainResult whole = run_training(o);
  expect_same_steps(o, m, cpu, whole);
  ASSERT_FALSE(whole.checkpoints.empty()) << "no checkpoint written";
  o.save = dir + "-resumed";
  o.save_every = 0;
  o.resume = dir + "/checkpoint-2";
  const TrainResult resumed = run_training(o);
  ASSERT_EQ(resumed.status, RunStatus::kOk) << resumed.error;
  EXPECT_EQ(resumed.resumed_from_step, 2);
  expect_same_steps(o, m, cpu, resumed, 2);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir + "-resumed");
}

class FinetuneOnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_under_test() == DeviceType::kCPU) {
      GTEST_SKIP() << "the fine-tuning methods are compared between the CPU and a device: set "
                      "SCALELAB_TEST_DEVICE=cuda on a machine with a GPU";
    }
  }
};

TEST_F(FinetuneOnDevice, LlamaEveryMethodMatchesTheCpu) {
  const std::string qlora_dir = testing::golden_dir("nf4/qlora");  // 128 x 128 projections: nf4 blocks
  const std::vector<Method> methods = {
      {"full fine-tuning", [](TrainOptions&) {}},
      {"full fine-tuning, embeddings and layer 0 frozen", [](TrainOptions& o) { freeze_prefix(o, "embed_tokens"); }},
      {"full fine-tuning, --optimizer-in-backward", optimizer_in_backward},
      {"LoRA, all projections, dropout 0.05", [](TrainOptions& o) { lora(o, kLlamaTargets, 0.05); }},
      {"LoRA, all projections, --fused-kernels (frozen head)",
       [](TrainOptions& o) {
         lora(o, kLlamaTargets);
         o.fused_kernels = true;
       }},
      {"QLoRA --quantize-base nf4",
       [&](TrainOptions& o) {
         o.model = qlora_dir;
         lora(o, kLlamaTargets);
         o.quantize_base = "nf4";
       }},
      {"QLoRA --quantize-base nf4-bnb",
       [](TrainOptions& o) {
         lora(o, kLlamaTargets);
         o.quantize_base = "nf4-bnb";
       }},
      {"QAT 8da4w",
       [](TrainOptions& o) {
         o.qat = "8da4w";
         o.qat_group_size = 32;
       },
       kQuantized, kQuantizedTrained},
      {"QAT 8da4w + LoRA",
       [](TrainOptions& o) {
         o.qat = "8da4w";
         o.qat_group_size = 32;
         lora(o, kLlamaTargets);
       },
       kQuantized},
  };
  for (const Method& m : methods) expect_same_run_on_both(tiny("llama-tiny"), m);
}

// DPO with LoRA and full on the golden model in `dir` (its tokenizer and pairs beside it).
void expect_dpo_same_on_both(const std::string& dir, const char* targets) {
  const std::vector<Method> methods = {
      {"DPO + LoRA (reference: adapters off)",
       [&](TrainOptions& o) {
         dpo(o, dir);
         lora(o, targets);
       }},
      {"DPO, full (reference: a frozen copy)", [&](TrainOptions& o) { dpo(o, dir); }},
  };
  for (const Method& m : methods) expect_same_run_on_both(tiny(dir), m);
}

TEST_F(FinetuneOnDevice, LlamaDpoMatchesTheCpu) {
  expect_dpo_same_on_both(testing::golden_dir("dpo/full_accum2"), kLlamaTargets);
  expect_dpo_same_on_both(testing::golden_dir("dpo/full_eval"), kLlamaTargets);  // with evaluation
}

TEST_F(FinetuneOnDevice, CheckpointsWrittenOnTheDeviceResumeThere) {
  const std::string dpo_dir = testing::golden_dir("dpo/full_eval");
  expect_device_checkpoint_resumes(tiny(dpo_dir), {"DPO, full, evaluated", [&](TrainOptions& o) { dpo(o, dpo_dir); }},
                                   "dpo_full");
  expect_device_checkpoint_resumes(tiny(dpo_dir),
                                   {"DPO + LoRA, evaluated",
                                    [&](TrainOptions& o) {
                                      dpo(o, dpo_dir);
                                      lora(o, kLlamaTargets);
                                    }},
                                   "dpo_lora");
  const std::string qlora_dir = testing::golden_dir("nf4/qlora");
  expect_device_checkpoint_resumes(tiny(qlora_dir),
                                   {"QLoRA --quantize-base nf4",
                                    [&](TrainOptions& o) {
                                      lora(o, kLlamaTargets);
                                      o.quantize_base = "nf4";
                                    }},
                                   "qlora");
  expect_device_checkpoint_resumes(tiny(dpo_dir),
                                   {"DPO + QLoRA nf4-bnb",
                                    [&](TrainOptions& o) {
                                      dpo(o, dpo_dir);
                                      lora(o, kLlamaTargets);
                                      o.quantize_base = "nf4-bnb";
                                    }},
                                   "dpo_qlora");
}

TEST_F(FinetuneOnDevice, OptEveryMethodMatchesTheCpu) {
  const std::vector<Method> methods = {
      {"full fine-tuning", [](TrainOptions&) {}},
      {"full fine-tuning, embeddings and layer 0 frozen", [](TrainOptions& o) { freeze_prefix(o, "embed"); }},
      {"LoRA, all projections, --fused-kernels (frozen head)",
       [](TrainOptions& o) {
         lora(o, kOptTargets, 0.05);
         o.fused_kernels = true;
       }},
      {"QLoRA --quantize-base nf4-bnb",
       [](TrainOptions& o) {
         lora(o, kOptTargets);
         o.quantize_base = "nf4-bnb";
       }},
      {"QAT 8da4w",
       [](TrainOptions& o) {
         o.qat = "8da4w";
         o.qat_group_size = 32;
       },
       kQuantized, kQuantizedTrained},
  };
  for (const Method& m : methods) expect_same_run_on_both(tiny("opt-tiny"), m);
}

TEST_F(FinetuneOnDevice, OptDpoMatchesTheCpu) {
  expect_dpo_same_on_both(testing::golden_dir("dpo/opt_full_eval"), kOptTargets);
}

}  // namespace
}  // namespace scalelab
