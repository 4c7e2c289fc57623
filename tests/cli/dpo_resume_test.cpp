// DPO checkpoints (--save-every / --resume): a resumed run continues bit for bit the uninterrupted
// one — losses, gradient norms, rewards, the held-out evaluations after the checkpoint and the saved
// result — with the reference rebuilt, not saved: under LoRA the adapters off (nothing to save),
// under full fine-tuning the initial weights of --model, checked against the CRC-32 the
// checkpointed run recorded (another --model exits 2). Llama and OPT, fp32 and bf16 autocast, and
// DPO over an NF4 base (QLoRA).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "cli/cli_run.h"
#include "model/safetensors.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/dpo/";

std::string file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The golden case's training flags (its expected.json), with LoRA's adapter when it has one.
std::string case_flags(const std::string& dir) {
  const nlohmann::json e = read_json(dir + "/expected.json");
  const nlohmann::json& t = e["training"];
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  std::string f = " --model " + dir + " --pairs " + dir + "/pairs.jsonl --beta " +
                  std::to_string(e["beta"].get<double>()) + " --label-smoothing " +
                  std::to_string(e["label_smoothing"].get<double>()) + " --micro-batch-size " + i("micro_batch_size") +
                  " --seq-len " + i("seq_len") + " --max-steps 5 --warmup-steps " + i("warmup_steps") +
                  " --grad-accum-steps " + i("grad_accum_steps") + " --lr " + s("lr") + " --weight-decay " +
                  s("weight_decay") + " --threads 1 --bench-warmup-steps 0";
  if (!e["lora"].is_null()) {
    std::string targets;
    for (const auto& x : e["lora"]["targets"]) {
      if (!targets.empty()) targets += ',';
      targets += x.get<std::string>();
    }
    f += " --lora-rank " + std::to_string(e["lora"]["r"].get<int>()) + " --lora-alpha " +
         std::to_string(e["lora"]["alpha"].get<double>()) + " --lora-targets " + targets + " --adapter " + dir +
         "/adapter_init";
  }
  if (std::filesystem::exists(dir + "/pairs_val.jsonl")) f += " --val-data " + dir + "/pairs_val.jsonl --eval-every 2";
  return f;
}

struct ResumeCase {
  const char* name;
  const char* golden;
  const char* extra;
};

class DpoResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(DpoResume, IsBitIdentical) {
  const ResumeCase c = GetParam();
  const std::string dir = kGolden + c.golden;
  const std::string a = testing::TempDir() + "dpo_resume_a_" + c.name, b = testing::TempDir() + "dpo_resume_b_" + c.name;
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
  const std::string base = "dpo" + case_flags(dir) + c.extra;
  auto r = run(base + " --save " + a + " --save-every 2 --json " + a + ".json");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string ckpt = a + "/checkpoint-2";
  const auto state = read_json(ckpt + "/trainer_state.json");
  const bool lora = base.find("--lora-rank") != std::string::npos;
  // Full fine-tuning records the reference's checksum; LoRA has no reference to rebuild.
  EXPECT_EQ(state.contains("rebuilt_from_model") && state["rebuilt_from_model"].contains("dpo_reference"), !lora)
      << state.dump();
  r = run(base + " --resume " + ckpt + " --save " + b + " --json " + b + ".json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  const auto ra = read_json(a + ".json"), rb = read_json(b + ".json");
  ASSERT_EQ(ra["losses"].size(), 5u);
  ASSERT_EQ(rb["losses"].size(), 3u);
  EXPECT_EQ(rb["resumed_from_step"], 2);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rb["losses"][i].get<double>(), ra["losses"][i + 2].get<double>()) << "step " << i + 3;
    EXPECT_EQ(rb["grad_norms"][i].get<double>(), ra["grad_norms"][i + 2].get<double>()) << "step " << i + 3;
    for (const char* k : {"rewards_chosen", "rewards_rejected", "reward_margins", "reward_accuracies"})
      EXPECT_EQ(rb["dpo"][k][i].get<double>(), ra["dpo"][k][i + 2].get<double>()) << k << " step " << i + 3;
  }
  if (base.find("--val-data") != std::string::npos) {
    // Uninterrupted: evaluations after steps 2, 4 and 5; resumed: 4 and 5, equal to the last bit.
    ASSERT_EQ(ra["evals"].size(), 3u);
    ASSERT_EQ(rb["evals"].size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) {
      nlohmann::json ea = ra["evals"][i + 1], eb = rb["evals"][i];
      ea.erase("seconds");
      eb.erase("seconds");
      EXPECT_EQ(ea, eb);
    }
  }
  const std::string saved = lora ? "/adapter_model.safetensors" : "/model.safetensors";
  EXPECT_EQ(file_bytes(a + saved), file_bytes(b + saved)) << "the saved result";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DpoResume,
    ::testing::Values(ResumeCase{"llama_full", "full_eval", ""},
                      ResumeCase{"llama_full_bf16", "full_eval", " --mixed-precision bf16"},
                      ResumeCase{"llama_lora", "lora_qv_smoothing", ""},
                      ResumeCase{"llama_qlora", "lora_qv_smoothing", " --quantize-base nf4-bnb"},
                      ResumeCase{"opt_full_accum2", "opt_full_eval", ""},
                      ResumeCase{"opt_lora", "opt_lora_eval", ""}),
    [](const ::testing::TestParamInfo<ResumeCase>& i) { return std::string(i.param.name); });

// Overwrites the first element of an F32 tensor of a safetensors file in place.
void set_first_f32(const std::string& path, const std::string& tensor, float value) {
  std::uint64_t header = 0;
  std::size_t begin = 0;
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    const SafetensorsTensor* t = f.find(tensor);
    ASSERT_NE(t, nullptr) << tensor;
    begin = t->begin;
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(&header), 8);  // the header's length (little-endian)
  }
  std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
  out.seekp(static_cast<std::streamoff>(8 + header + begin));
  out.write(reinterpret_cast<const char*>(&value), 4);
}

// Full fine-tuning: the reference is rebuilt from --model, so a resume from another model with the
// same config (one weight changed), or with other DPO settings, exits 2 naming what differs.
TEST(DpoResumeCli, AnotherReferenceOrOtherSettingsAreRefused) {
  const std::string dir = kGolden + "full_eval";
  const std::string a = testing::TempDir() + "dpo_resume_refused";
  std::filesystem::remove_all(a);
  auto r = run("dpo" + case_flags(dir) + " --quiet --save " + a + " --save-every 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string other = testing::TempDir() + "dpo_other_model";
  std::filesystem::remove_all(other);
  std::filesystem::create_directories(other);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"})
    std::filesystem::copy_file(dir + "/" + f, other + "/" + f);
  set_first_f32(other + "/model.safetensors", "model.layers.1.mlp.down_proj.weight", 0.5f);
  std::string moved = case_flags(dir);  // the same flags and pairs, --model other
  moved.replace(moved.find(" --model " + dir), 9 + dir.size(), " --model " + other);
  r = run("dpo" + moved + " --resume " + a + "/checkpoint-2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--resume] the DPO reference model (the initial weights) rebuilt from --model"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resume with that run's --model, unchanged"), std::string::npos) << r.output;
  // Another beta: refused naming it.
  std::string flags = case_flags(dir);
  const std::size_t at = flags.find(" --beta 0.100000");
  ASSERT_NE(at, std::string::npos) << flags;
  flags.replace(at, 16, " --beta 0.300000");
  r = run("dpo" + flags + " --resume " + a + "/checkpoint-2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("beta 0.1 in the checkpoint, 0.3 now"), std::string::npos) << r.output;
  // A DPO checkpoint is not an SFT one.
  r = run("train --model " + dir + " --data synthetic --seq-len 32 --micro-batch-size 2 --max-steps 5 --lr 0.002 "
          "--weight-decay 0.1 --warmup-steps 1 --threads 1 --resume " + a + "/checkpoint-2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("dpo true in the checkpoint, false now"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace scalelab
