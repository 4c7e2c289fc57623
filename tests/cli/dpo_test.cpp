// scalelab dpo end to end: the per-step loss, rewards, margin and accuracy against the PyTorch
// reference (tests/golden/data/dpo, make_dpo_golden.py: full fine-tuning with a frozen reference
// copy and gradient accumulation; LoRA with the adapters off as the reference and label
// smoothing), the tokenization of the pairs, the refusals of bad input (exit 2 naming the line or
// flag), and the memory plan (`plan --dpo`) against the measured peak.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli_run.h"
#include "train/data.h"
#include "train/dpo.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/dpo/";

std::string dpo_flags(const nlohmann::json& e) {
  const nlohmann::json& t = e["training"];
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  std::string f = " --beta " + std::to_string(e["beta"].get<double>()) + " --label-smoothing " +
                  std::to_string(e["label_smoothing"].get<double>()) + " --micro-batch-size " + i("micro_batch_size") +
                  " --seq-len " + i("seq_len") + " --max-steps " + i("max_steps") + " --warmup-steps " +
                  i("warmup_steps") + " --grad-accum-steps " + i("grad_accum_steps") + " --lr " + s("lr") +
                  " --lr-scheduler linear --weight-decay " + s("weight_decay") + " --adam-beta1 " + s("adam_beta1") +
                  " --adam-beta2 " + s("adam_beta2") + " --adam-epsilon 1e-8 --max-grad-norm " + s("max_grad_norm") +
                  " --threads 1 --bench-warmup-steps 0";
  if (!e["lora"].is_null()) {
    std::string targets;
    for (const auto& x : e["lora"]["targets"]) {
      if (!targets.empty()) targets += ',';
      targets += x.get<std::string>();
    }
    f += " --lora-rank " + std::to_string(e["lora"]["r"].get<int>()) + " --lora-alpha " +
         std::to_string(e["lora"]["alpha"].get<double>()) + " --lora-targets " + targets;
  }
  return f;
}

class DpoGolden : public ::testing::TestWithParam<const char*> {};

// Per step: the loss, the mean rewards (chosen, rejected), the margin and the accuracy within
// 1e-5 of the reference (fp32 both; the sums over ~10 tokens of log-probabilities of ~7 differ by
// rounding, ~1e-6, times beta); the gradient norm within 1e-4 relative.
TEST_P(DpoGolden, StepsEqualTheReference) {
  const std::string dir = kGolden + GetParam();
  const nlohmann::json e = read_json(dir + "/expected.json");
  const std::string json = testing::TempDir() + "dpo_" + GetParam() + ".json";
  std::string cmd = "dpo --model " + dir + " --pairs " + dir + "/pairs.jsonl" + dpo_flags(e) + " --json " + json;
  if (!e["lora"].is_null()) cmd += " --adapter " + dir + "/adapter_init";
  const bool eval = e.contains("evals");
  if (eval) cmd += " --val-data " + dir + "/pairs_val.jsonl --eval-every " + std::to_string(e["eval_every"].get<int>());
  const auto r = run(cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  // The progress line carries the rewards.
  EXPECT_NE(r.output.find("| rewards chosen "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| accuracy "), std::string::npos) << r.output;
  const nlohmann::json rec = read_json(json);
  ASSERT_EQ(rec["status"], "ok") << rec.dump();
  const auto& d = rec["dpo"];
  const std::size_t n = e["losses"].size();
  ASSERT_EQ(rec["losses"].size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(rec["losses"][i].get<double>(), e["losses"][i].get<double>(), 1e-5) << "loss, step " << i + 1;
    EXPECT_NEAR(d["rewards_chosen"][i].get<double>(), e["rewards_chosen"][i].get<double>(), 1e-5) << "step " << i + 1;
    EXPECT_NEAR(d["rewards_rejected"][i].get<double>(), e["rewards_rejected"][i].get<double>(), 1e-5)
        << "step " << i + 1;
    EXPECT_NEAR(d["reward_margins"][i].get<double>(), e["reward_margins"][i].get<double>(), 1e-5) << "step " << i + 1;
    EXPECT_NEAR(d["reward_accuracies"][i].get<double>(), e["reward_accuracies"][i].get<double>(), 1e-5)
        << "step " << i + 1;
    const double gn = e["grad_norms"][i].get<double>();
    EXPECT_NEAR(rec["grad_norms"][i].get<double>(), gn, 1e-4 * gn + 1e-7) << "grad norm, step " << i + 1;
  }
  EXPECT_EQ(rec["final_reward_accuracy"], d["reward_accuracies"].back());
  EXPECT_EQ(rec["config"]["model_family"], e.value("family", std::string("llama")));
  if (eval) {
    // trl's evaluation metrics on the held-out pairs after every eval_every steps and the last,
    // within 1e-5 as the training steps' (the mean over pairs of sums of ~10 log-probabilities).
    EXPECT_NE(r.output.find("eval step 2/"), std::string::npos) << r.output;
    const auto& want = e["evals"];
    const auto& got = rec["evals"];
    ASSERT_EQ(got.size(), want.size()) << got.dump();
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto& w = want[i];
      const auto& g = got[i];
      EXPECT_EQ(g["step"], w["step"]);
      EXPECT_EQ(g["val_pairs"], w["pairs"]);
      EXPECT_NEAR(g["val_loss"].get<double>(), w["loss"].get<double>(), 1e-5) << "eval " << i;
      EXPECT_NEAR(g["val_rewards_chosen"].get<double>(), w["rewards_chosen"].get<double>(), 1e-5) << "eval " << i;
      EXPECT_NEAR(g["val_rewards_rejected"].get<double>(), w["rewards_rejected"].get<double>(), 1e-5) << "eval " << i;
      EXPECT_NEAR(g["val_reward_margin"].get<double>(), w["reward_margin"].get<double>(), 1e-5) << "eval " << i;
      EXPECT_NEAR(g["val_reward_accuracy"].get<double>(), w["reward_accuracy"].get<double>(), 1e-5) << "eval " << i;
    }
    // The last evaluation at the top of the record (where the lab reads it); no perplexity.
    EXPECT_EQ(rec["val_loss"], got.back()["val_loss"]);
    EXPECT_EQ(rec["val_reward_accuracy"], got.back()["val_reward_accuracy"]);
    EXPECT_EQ(rec["val_reward_margin"], got.back()["val_reward_margin"]);
    EXPECT_TRUE(rec["val_perplexity"].is_null());
    EXPECT_NE(r.output.find("Validation (5 held-out pairs)"), std::string::npos) << r.output;
  }
  EXPECT_EQ(rec["config"]["dpo"], true);
  EXPECT_EQ(rec["config"]["dpo_reference"], e["lora"].is_null() ? "a frozen copy of the initial weights"
                                                                  : "the policy with its LoRA adapters off");
}

// scalelab's tokenization of the pairs equals the reference's (transformers' tokenizer): prompt
// with the template's BOS, completions without special tokens plus EOS, cut to seq_len + 1.
TEST_P(DpoGolden, PairsTokenizeAsTheReference) {
  const std::string dir = kGolden + GetParam();
  const nlohmann::json e = read_json(dir + "/expected.json");
  const PreferenceData d = read_preference_pairs(dir + "/pairs.jsonl", e["training"]["seq_len"].get<std::int64_t>(),
                                                 100000, TextSourceOptions{"", dir, "--pairs"});
  ASSERT_EQ(d.pairs.size(), e["pairs_tokens"].size());
  for (std::size_t i = 0; i < d.pairs.size(); ++i) {
    const auto& w = e["pairs_tokens"][i];
    EXPECT_EQ(d.pairs[i].prompt, w["prompt"].get<std::vector<std::int32_t>>()) << i;
    EXPECT_EQ(d.pairs[i].chosen, w["chosen"].get<std::vector<std::int32_t>>()) << i;
    EXPECT_EQ(d.pairs[i].rejected, w["rejected"].get<std::vector<std::int32_t>>()) << i;
  }
  EXPECT_EQ(d.truncated, 2);  // the rejected answers of pairs 5 and 7 fill the sequence
  if (e.contains("val_pairs_tokens")) {
    const PreferenceData v = read_preference_pairs(dir + "/pairs_val.jsonl", e["training"]["seq_len"].get<std::int64_t>(),
                                                   100000, TextSourceOptions{"", dir, "--val-data"});
    ASSERT_EQ(v.pairs.size(), e["val_pairs_tokens"].size());
    for (std::size_t i = 0; i < v.pairs.size(); ++i) {
      const auto& w = e["val_pairs_tokens"][i];
      EXPECT_EQ(v.pairs[i].prompt, w["prompt"].get<std::vector<std::int32_t>>()) << i;
      EXPECT_EQ(v.pairs[i].chosen, w["chosen"].get<std::vector<std::int32_t>>()) << i;
      EXPECT_EQ(v.pairs[i].rejected, w["rejected"].get<std::vector<std::int32_t>>()) << i;
    }
  }
}

// full_accum2 / lora_qv_smoothing: Llama, training steps only. full_eval: Llama with held-out
// pairs (5 pairs in micro-batches of 2: the last one partial). opt_full_eval / opt_lora_eval: OPT
// (biases, learned positions, tied head) with a frozen reference copy and with the adapters off.
INSTANTIATE_TEST_SUITE_P(Reference, DpoGolden,
                         ::testing::Values("full_accum2", "lora_qv_smoothing", "full_eval", "opt_full_eval",
                                           "opt_lora_eval"));

std::string write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "dpo_cli_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DpoCli, BadInputExitsTwoNamingIt) {
  const std::string dir = kGolden + "full_accum2";
  const std::string base = "dpo --model " + dir + " --seq-len 16 --micro-batch-size 1 --max-steps 1 --threads 1 --quiet";
  const std::string ok = R"({"prompt": "Hi", "chosen": " yes", "rejected": " no"})";
  struct Case {
    std::string pairs, flags, want;
  };
  const std::vector<Case> cases = {
      {ok + "\n" + R"({"prompt": "Hi", "chosen": " yes"})", "", "line 2: the field \"rejected\" is missing"},
      {ok + "\n" + R"({"prompt": "Hi", "chosen": " yes", "rejected": ""})", "", "line 2: the rejected completion is empty"},
      {R"({"prompt": "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen", "chosen": " a", "rejected": " b"})",
       "", "line 1: the prompt is"},
      {ok, " --fused-kernels", "[--fused-kernels]"},
      {ok, " --beta 0", "[--beta]"},
      {ok, " --label-smoothing 0.5", "[--label-smoothing]"},
      {ok, " --data synthetic", "[--data]"},
      // Held-out pairs are read (and refused) as --pairs are, naming --val-data.
      {ok, " --val-data " + write("bad_val.jsonl", ok + "\n" + R"({"prompt": "Hi", "chosen": "", "rejected": " no"})"),
       "[--val-data] "},
      {ok, " --val-data " + write("bad_val2.jsonl", ok) + " --eval-every -1", "[--eval-every]"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto r = run(base + " --pairs " + write("bad" + std::to_string(i) + ".jsonl", cases[i].pairs) + cases[i].flags);
    EXPECT_EQ(r.code, 2) << cases[i].want << "\n" << r.output;
    EXPECT_NE(r.output.find(cases[i].want), std::string::npos) << r.output;
  }
  const auto none = run(base);
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("[--pairs] is required"), std::string::npos) << none.output;
  const std::string record = testing::TempDir() + "dpo_failed.json";
  const auto missing = run(base + " --pairs /nonexistent/pairs.jsonl --json " + record);
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent/pairs.jsonl"), std::string::npos) << missing.output;
  // A failed run still leaves its record, as train's does (the same run_and_record).
  const auto rec = read_json(record);
  EXPECT_EQ(rec["status"], "error");
  EXPECT_NE(rec["error"].get<std::string>().find("/nonexistent/pairs.jsonl"), std::string::npos);
  EXPECT_EQ(rec["launcher"], "none");
}

// The plan of a DPO step (scalelab plan --dpo) equals the measured peak, with the frozen reference
// copy counted (full fine-tuning: as large as the weights) or absent (LoRA: the adapters off).
TEST(DpoCli, MeasuredPeakEqualsThePlan) {
  const std::string json = testing::TempDir() + "dpo_peak.json", plan = testing::TempDir() + "dpo_plan.json";
  for (const std::string model : {"full_accum2", "opt_full_eval"})  // Llama; OPT (biases, learned positions)
  for (const std::string sw : {"", " --lora-rank 4 --lora-targets q_proj,v_proj",
                               " --activation-checkpointing --attn flash --mixed-precision bf16"}) {
    const std::string dir = kGolden + model;
    // Large enough that the activations and logits, not the 2 MiB segment rounding, set the peak.
    const std::string common = " --model " + dir + " --seq-len 64 --micro-batch-size 8 --threads 1" + sw;
    const auto r = run("dpo --pairs " + dir + "/pairs.jsonl --max-steps 2 --quiet --json " + json + common);
    ASSERT_EQ(r.code, 0) << r.output;
    // With the trial's own DPO flags, as an OOM search plans a DPO trial (they do not change the plan).
    const auto p = run("plan --dpo --pairs " + dir + "/pairs.jsonl --beta 0.1 --device meta --json " + plan + common);
    ASSERT_EQ(p.code, 0) << p.output;
    const auto rec = read_json(json), pl = read_json(plan);
    EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]) << model << sw;
    EXPECT_EQ(pl["total_bytes"], rec["memory_plan"]["total_bytes"]) << model << sw;
    std::size_t weights = 0, reference = 0;
    for (const auto& it : pl["items"]) {
      if (it["name"] == "weights") weights = it["bytes"];
      if (it["name"] == "reference model") reference = it["bytes"];
    }
    if (sw.find("lora") != std::string::npos) {
      EXPECT_EQ(reference, 0u) << "LoRA: no reference copy";
      EXPECT_NE(p.output.find("reference: the adapters off"), std::string::npos) << p.output;
    } else if (sw.empty()) {
      EXPECT_EQ(reference, weights) << "fp32: the reference copy is as large as the weights";
      EXPECT_NE(p.output.find("reference model"), std::string::npos) << p.output;
    } else {
      // weights: the fp32 master and the bf16 compute copy; the reference copies the compute copy.
      EXPECT_NEAR(static_cast<double>(reference) * 3, static_cast<double>(weights), 2048.0) << "bf16 reference copy";
    }
  }
}

}  // namespace
}  // namespace scalelab
