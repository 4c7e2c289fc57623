// --optimizer-in-backward: each decoder layer's AdamW update runs in backward as soon as its
// gradients are final, over a gradient buffer that holds one layer's gradients (a slot every layer
// shares) plus those of the parameters outside the layers (ParamLayout::share_layer_gradients).
//
// What must hold: the same arithmetic as the step-end update, so the weights after several steps
// are bit-identical to a run without the switch (no clipping in either: the switch refuses it);
// the losses equal; the reported gradient norm equal up to the summation order (it is summed range
// by range, not in one pass: kNormRelTol below); the plan still equals the measured peak and its gradients item
// is the compact buffer; and the refusals of what cannot work (clipping, accumulation, fp16).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "model/config.h"
#include "model/decoder/linear.h"
#include "model/family.h"
#include "model/params.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

std::vector<std::pair<std::int64_t, std::int64_t>> layer_ranges(const ModelConfig& c, const ParamLayout& L) {
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) r.push_back(param_range(L, family_of(c).layer_prefix(l)));
  return r;
}

TEST(InBackwardLayout, LayersShareOneSlotAfterTheOtherParameters) {
  const ModelConfig c = preset_config("llama-tiny");
  ParamLayout L = ParamLayout::build(c);
  const auto layers = layer_ranges(c, L);
  ASSERT_EQ(layers.size(), 2u);
  const std::int64_t slot = layers[0].second - layers[0].first;
  ASSERT_EQ(layers[1].second - layers[1].first, slot);
  const std::int64_t outside = L.trainable_numel() - 2 * slot;
  L.share_layer_gradients(layers);
  ASSERT_TRUE(L.shares_layer_gradients());
  EXPECT_EQ(L.grad_numel(), outside + slot);
  // Every trainable parameter: inside a layer at the slot (after the outside ones) plus its
  // offset in the layer; outside, packed in layout order before the slot.
  std::int64_t next_outside = 0;
  for (const ParamInfo& p : L.params()) {
    const std::int64_t g = L.grad_offset(p.offset);
    int layer = -1;
    for (int l = 0; l < 2; ++l)
      if (p.offset >= layers[l].first && p.offset < layers[l].second) layer = l;
    if (layer >= 0) {
      EXPECT_EQ(g, outside + (p.offset - layers[layer].first)) << p.name;
    } else {
      EXPECT_EQ(g, next_outside) << p.name;
      next_outside += p.numel;
    }
    const std::int64_t last = L.grad_offset(p.offset + p.numel - 1);
    EXPECT_EQ(last, g + p.numel - 1) << p.name << " is split";
    EXPECT_LT(last, L.grad_numel()) << p.name;
  }
  EXPECT_EQ(next_outside, outside);
  // A range across layer 0 and what follows splits into segments, each contiguous in the buffer.
  const auto segs = L.grad_segments(layers[0].first, L.trainable_numel());
  std::int64_t covered = 0;
  for (const auto& s : segs) covered += s.end - s.begin;
  EXPECT_EQ(covered, L.trainable_numel() - layers[0].first);
  EXPECT_TRUE(segs.front().shared);
  // Re-laying out (freeze) drops the mapping: its offsets no longer apply.
  L.freeze("embed_tokens");
  EXPECT_FALSE(L.shares_layer_gradients());
  EXPECT_EQ(L.grad_numel(), L.trainable_numel());
}

struct Case {
  std::string model = "";
  std::string what = "";
  std::string attn = "eager";
  bool fused = false, ckpt = false;
  std::string model_precision = "fp32", mixed = "no";
  std::string freeze = "";
  std::int64_t lora_rank = 0;
  double dropout = -1;
  std::string dpo_pairs = "";  // DPO on these pairs (the model's vocabulary must cover the tokenizer's)
};

std::string describe(const Case& c) {
  return c.what + " (" + c.attn + (c.fused ? " fused" : "") + (c.ckpt ? " ckpt" : "") + " " + c.model_precision +
         "/" + c.mixed + (c.freeze.empty() ? "" : " freeze " + c.freeze) +
         (c.lora_rank ? " lora " + std::to_string(c.lora_rank) : "") + ")";
}

TrainOptions options_of(const Case& c, bool in_backward, const std::string& save) {
  TrainOptions o;
  o.model = c.model;
  o.micro_batch_size = 2;
  o.seq_len = 32;
  o.max_steps = 3;
  o.lr = 1e-2;  // large: every step moves the weights visibly (a missed update would show)
  o.weight_decay = 0.1;  // decay and no-decay ranges both exercised
  o.max_grad_norm = 0;
  o.attn = c.attn;
  o.fused_kernels = c.fused;
  o.activation_checkpointing = c.ckpt;
  o.model_precision = c.model_precision;
  o.mixed_precision = c.mixed;
  o.freeze = c.freeze;
  o.lora_rank = c.lora_rank;
  if (c.lora_rank) o.lora_targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  o.dropout = c.dropout;
  if (!c.dpo_pairs.empty()) {
    o.dpo.enabled = true;
    o.dpo.pairs = c.dpo_pairs;
    o.tokenizer = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/tokenizer/llama3_style/tokenizer.json";
  }
  o.threads = 2;
  o.quiet = true;
  o.optimizer_in_backward = in_backward;
  o.save = save;
  return o;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string config_dir(const std::string& name, ModelConfig c) {
  const std::string dir = testing::TempDir() + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << c.to_hf_json().dump(2);
  return dir;
}

// The reported norm is summed range by range instead of in one pass over the buffer. sum_of_squares
// adds squares in 8 fp32 lanes per chunk of 2^16 elements (then in double), so each lane sums at
// most 8192 non-negative terms: relative error at most 8191 * 2^-24 (5e-4) of the sum, half that of
// its root, whichever way the buffer is cut. The weights, not the norm, are compared bit for bit.
constexpr double kNormRelTol = 8192.0 / 16777216.0 / 2.0;

double item_bytes(const nlohmann::json& plan, const char* name) {
  for (const auto& it : plan["items"])
    if (it["name"] == name) return it["bytes"].get<double>();
  return 0.0;
}

TEST(InBackwardTrain, WeightsBitIdenticalToTheStepEndUpdateAndPlanEqualsMeasured) {
  ModelConfig untied = preset_config("llama-tiny");
  untied.tie_word_embeddings = false;
  const std::string llama_untied = config_dir("inbwd_llama_untied", untied);
  ModelConfig opt = preset_config("opt-tiny");
  opt.word_embed_proj_dim = 32;  // project_in/out outside the layers
  opt.tie_word_embeddings = false;
  const std::string opt_proj = config_dir("inbwd_opt_proj", opt);
  // DPO: the policy updates in backward; its reference (a frozen copy, or the adapters off) never does.
  ModelConfig wide = preset_config("llama-tiny");
  wide.vocab_size = 4096;  // the test tokenizer's ids
  const std::string llama_wide = config_dir("inbwd_llama_wide", wide);
  const std::string pairs = testing::TempDir() + "inbwd_pairs.jsonl";
  {
    std::ofstream f(pairs);
    const char* rows[] = {R"({"prompt": "What is two plus two?", "chosen": " Four.", "rejected": " Five, I think."})",
                          R"({"prompt": "Name a colour.", "chosen": " Blue", "rejected": " A chair"})",
                          R"({"prompt": "Say hi", "chosen": " Hi there!", "rejected": " No."})",
                          R"({"prompt": "Capital of France?", "chosen": " Paris", "rejected": " Rome, probably"})"};
    for (const char* r : rows) f << r << "\n";
  }
  const std::vector<Case> cases = {
      {"llama-tiny", "llama, tied head"},
      {llama_untied, "llama, untied head", "flash", true, true},
      {"llama-tiny", "llama, bf16 weights (stochastic rounding)", "eager", false, false, "bf16"},
      {"llama-tiny", "llama, bf16 mixed precision (compute copy)", "flash", true, false, "fp32", "bf16"},
      {"llama-tiny", "llama, layer 1's MLP and the embeddings frozen", "eager", false, false, "fp32", "no",
       "layers\\.1\\.mlp|embed"},
      {"llama-tiny", "llama, LoRA", "eager", false, false, "fp32", "no", "", 4},
      {"qwen2-tiny", "qwen2 (q/k/v biases)", "flash"},
      {"opt-tiny", "opt, tied head, dropout", "eager", false, false, "fp32", "no", "", 0, 0.1},
      {opt_proj, "opt, project_in/out, untied", "flash", true, true},
      {llama_wide, "DPO, full (frozen reference copy)", "eager", false, false, "fp32", "no", "", 0, -1, pairs},
      {llama_wide, "DPO, LoRA (reference: adapters off)", "flash", false, false, "fp32", "no", "", 4, -1, pairs},
  };
  for (const Case& c : cases) {
    const std::string a = testing::TempDir() + "inbwd_step_end", b = testing::TempDir() + "inbwd_in_backward";
    std::filesystem::remove_all(a);
    std::filesystem::remove_all(b);
    const TrainResult ra = run_training(options_of(c, false, a));
    const TrainResult rb = run_training(options_of(c, true, b));
    ASSERT_EQ(ra.status, RunStatus::kOk) << describe(c) << ": " << ra.error;
    ASSERT_EQ(rb.status, RunStatus::kOk) << describe(c) << ": " << rb.error;
    ASSERT_EQ(ra.steps.size(), rb.steps.size());
    for (std::size_t i = 0; i < ra.steps.size(); ++i) {
      EXPECT_EQ(ra.steps[i].loss, rb.steps[i].loss) << describe(c) << " step " << i + 1;
      EXPECT_NEAR(ra.steps[i].grad_norm, rb.steps[i].grad_norm, kNormRelTol * ra.steps[i].grad_norm)
          << describe(c) << " step " << i + 1;
    }
    const char* file = c.lora_rank ? "/adapter_model.safetensors" : "/model.safetensors";
    const std::string wa = read_bytes(a + file), wb = read_bytes(b + file);
    ASSERT_FALSE(wa.empty()) << describe(c);
    EXPECT_TRUE(wa == wb) << describe(c) << ": the saved weights differ";
    // The plan runs the engine's allocations, with the compact gradient buffer.
    EXPECT_EQ(rb.plan["total_bytes"].get<std::size_t>(), rb.max_reserved_bytes) << describe(c);
    EXPECT_EQ(ra.plan["total_bytes"].get<std::size_t>(), ra.max_reserved_bytes) << describe(c);
    const PlanInput pin = make_plan_input(options_of(c, true, ""));
    const ParamLayout layout = build_layout(pin);
    EXPECT_TRUE(layout.shares_layer_gradients()) << describe(c);
    EXPECT_LT(layout.grad_numel(), layout.trainable_numel()) << describe(c);
    EXPECT_EQ(item_bytes(rb.plan, "gradients"),
              static_cast<double>(DeviceAllocator::round_size(static_cast<std::size_t>(layout.grad_numel()) *
                                                              dtype_size(pin.precision.grad))))
        << describe(c);
    EXPECT_LT(item_bytes(rb.plan, "gradients"), item_bytes(ra.plan, "gradients")) << describe(c);
    EXPECT_EQ(rb.config["optimizer_in_backward"], true);
  }
}

TEST(InBackwardTrain, ResumesBitIdentically) {
  Case c{"llama-tiny", "resume"};
  const std::string dir = testing::TempDir() + "inbwd_resume", full = testing::TempDir() + "inbwd_full";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(full);
  TrainOptions o = options_of(c, true, full);
  o.max_steps = 4;
  const TrainResult whole = run_training(o);
  ASSERT_EQ(whole.status, RunStatus::kOk) << whole.error;
  // The same run with checkpoints every 2 steps, then steps 3 and 4 again from checkpoint-2.
  TrainOptions first = options_of(c, true, dir);
  first.max_steps = 4;
  first.save_every = 2;
  const TrainResult r1 = run_training(first);
  ASSERT_EQ(r1.status, RunStatus::kOk) << r1.error;
  TrainOptions resume = options_of(c, true, testing::TempDir() + "inbwd_resumed");
  resume.max_steps = 4;
  resume.resume = dir + "/checkpoint-2";
  const TrainResult r2 = run_training(resume);
  ASSERT_EQ(r2.status, RunStatus::kOk) << r2.error;
  ASSERT_EQ(r2.steps.size(), 2u);
  EXPECT_EQ(r2.steps[0].loss, whole.steps[2].loss);
  EXPECT_EQ(r2.steps[1].loss, whole.steps[3].loss);
  EXPECT_TRUE(read_bytes(full + "/model.safetensors") ==
              read_bytes(testing::TempDir() + "inbwd_resumed/model.safetensors"));
}

TEST(InBackwardOptions, RefusesWhatNeedsEveryGradientFirst) {
  auto message = [](const TrainOptions& o) -> std::string {
    try {
      validate_train_options(o);
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "";
  };
  TrainOptions o;
  o.model = "llama-tiny";
  o.optimizer_in_backward = true;
  // The default --max-grad-norm 1 clips by the global norm.
  EXPECT_NE(message(o).find("--max-grad-norm 0"), std::string::npos) << message(o);
  o.max_grad_norm = 0;
  EXPECT_EQ(message(o), "");
  o.grad_accum_steps = 2;
  EXPECT_NE(message(o).find("--grad-accum-steps 1"), std::string::npos) << message(o);
  o.grad_accum_steps = 1;
  o.mixed_precision = "fp16";
  EXPECT_NE(message(o).find("fp16 loss scaling"), std::string::npos) << message(o);
  o.mixed_precision = "bf16";
  EXPECT_EQ(message(o), "");
}

}  // namespace
}  // namespace scalelab
