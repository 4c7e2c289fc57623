// QLoRA (--quantize-base nf4 | nf4-bnb): the end-to-end trajectory against the torchtune-style
// golden (tests/golden/data/nf4/qlora, make_nf4_golden.py: transformers' Llama with every projection
// a QLoRA linear over torchao's NF4Tensor, or over bitsandbytes' quantize_4bit, from the same A and
// B), the run record, the measured peak against the plan, the plan's bytes per quantized parameter,
// and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli_run.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/nf4/qlora";
const std::string kAll = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";

std::string train_flags(const nlohmann::json& t) {
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  return " --micro-batch-size " + i("micro_batch_size") + " --seq-len " + i("seq_len") + " --max-steps " +
         i("max_steps") + " --warmup-steps " + i("warmup_steps") + " --grad-accum-steps " + i("grad_accum_steps") +
         " --lr " + s("lr") + " --lr-scheduler linear --weight-decay " + s("weight_decay") + " --adam-beta1 " +
         s("adam_beta1") + " --adam-beta2 " + s("adam_beta2") + " --adam-epsilon 1e-8 --max-grad-norm " +
         s("max_grad_norm") + " --threads 1 --bench-warmup-steps 0 --quiet";
}

class QloraGolden : public ::testing::TestWithParam<const char*> {};

// From the golden's A and B, the per-step losses equal the reference's (relative), and the run
// record names the flavour.
TEST_P(QloraGolden, TrajectoryEqualsTheReference) {
  const std::string flavor = GetParam();
  const std::string tag = flavor == std::string("nf4") ? "nf4" : "nf4_bnb";
  const nlohmann::json e = read_json(kGolden + "/expected_" + tag + ".json");
  const std::string json = testing::TempDir() + "qlora_" + tag + ".json";
  const std::string out = testing::TempDir() + "qlora_out_" + tag;
  std::filesystem::remove_all(out);
  const auto r = run("train --model " + kGolden + " --data " + kGolden + "/tokens.bin" + train_flags(e["training"]) +
                     " --lora-rank 8 --lora-alpha 16 --lora-targets " + kAll + " --quantize-base " + flavor +
                     " --adapter " + kGolden + "/adapter_init --save " + out + " --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json rec = read_json(json);
  const auto& want = e["losses"];
  const auto& got = rec["losses"];
  ASSERT_EQ(got.size(), want.size());
  // The issue asks for 1e-4; held to 2e-5 (measured <= 7.9e-6), tighter than the distance to the
  // other flavour's trajectory (up to 1.5e-4), so that a run with the wrong quantizer fails.
  const nlohmann::json other =
      read_json(kGolden + "/expected_" + std::string(tag == std::string("nf4") ? "nf4_bnb" : "nf4") + ".json");
  double to_other = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double w = want[i].get<double>(), g = got[i].get<double>(), o = other["losses"][i].get<double>();
    EXPECT_NEAR(g, w, 2e-5 * std::abs(w)) << "step " << i + 1;
    to_other = std::max(to_other, std::abs(g - o) / std::abs(o));
  }
  EXPECT_GT(to_other, 5e-5);
  const auto& q = rec["config"]["lora"]["quantize_base"];
  EXPECT_EQ(q["flavor"], flavor);
  EXPECT_NE(q["reference"].get<std::string>().find(flavor == std::string("nf4") ? "torchao" : "bitsandbytes"),
            std::string::npos);
  EXPECT_EQ(rec["config"]["quantize_base"], flavor);
  EXPECT_TRUE(std::filesystem::exists(out + "/adapter_model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Reference, QloraGolden, ::testing::Values("nf4", "nf4-bnb"));

// The two flavours quantize differently, so their trajectories differ (by far less than the loss
// moves), as the references' do.
TEST(QloraCli, TheFlavoursGiveDifferentTrajectories) {
  const nlohmann::json a = read_json(kGolden + "/expected_nf4.json"), b = read_json(kGolden + "/expected_nf4_bnb.json");
  EXPECT_NE(a["losses"], b["losses"]);
}

TEST(QloraCli, MeasuredPeakEqualsThePlan) {
  const std::string json = testing::TempDir() + "qlora_peak.json";
  for (const std::string& args : std::vector<std::string>{"--model llama-tiny --quantize-base nf4-bnb", "--model llama-tiny --quantize-base nf4-bnb --activation-checkpointing --attn flash --mixed-precision bf16",
        "--model " + kGolden + " --quantize-base nf4", "--model llama-small --quantize-base nf4"}) {
    const auto r = run("train " + args + " --seq-len 32 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet "
                       "--lora-rank 8 --lora-targets " + kAll + " --json " + json);
    ASSERT_EQ(r.code, 0) << args << "\n" << r.output;
    const auto rec = read_json(json);
    EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]) << args;
    EXPECT_EQ(rec["frozen_params"].get<std::int64_t>() + rec["trainable_params"].get<std::int64_t>(),
              rec["params"].get<std::int64_t>());
  }
}

// llama-3.2-1b, fp32, r = 8 on all seven projections: the linear weights of the layers (973M
// parameters, 3.9 GB in fp32) take about 0.516 bytes each in NF4, ~0.5 GB.
TEST(QloraCli, PlanCountsAboutHalfABytePerQuantizedParameter) {
  const std::string lo = testing::TempDir() + "qlora_plan_lora.json", q = testing::TempDir() + "qlora_plan_nf4.json";
  const std::string common = "plan --model llama-3.2-1b --seq-len 64 --micro-batch-size 1 --device meta --lora-rank 8 "
                             "--lora-targets " + kAll;
  auto r = run(common + " --json " + lo);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(common + " --quantize-base nf4 --json " + q);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("in nf4"), std::string::npos) << r.output;
  auto item = [](const nlohmann::json& p, const std::string& name) -> std::int64_t {
    for (const auto& it : p["items"])
      if (it["name"] == name) return it["bytes"].get<std::int64_t>();
    return -1;
  };
  const auto a = read_json(lo), b = read_json(q);
  EXPECT_EQ(a["params"], b["params"]);
  EXPECT_EQ(a["trainable_params"], b["trainable_params"]);
  // Linear weights of the 16 layers: (4·2048² / 4 ... ) computed from the config: q,o 2048², k,v 512·2048,
  // gate, up, down 8192·2048.
  const std::int64_t linear = 16 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048);
  const std::int64_t saved = item(a, "weights") - item(b, "weights");
  const double nf4_bytes = static_cast<double>(4 * linear - saved);
  EXPECT_NEAR(nf4_bytes / static_cast<double>(linear), 0.516, 0.001);
  EXPECT_NEAR(static_cast<double>(4 * linear) / 1e9, 3.9, 0.05);
  EXPECT_NEAR(nf4_bytes / 1e9, 0.50, 0.01);
}

TEST(QloraCli, BadInputExitsTwoNamingTheFlag) {
  const std::string base = "train --model llama-tiny --max-steps 1 --seq-len 16 --quiet";
  auto r = run(base + " --quantize-base nf4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--quantize-base]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("add --lora-rank"), std::string::npos) << r.output;
  r = run(base + " --lora-rank 4 --quantize-base int4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("use nf4"), std::string::npos) << r.output;
  // torchao's blocks: llama-tiny's 64 x 64 projections are not a multiple of 16384 elements.
  r = run(base + " --lora-rank 4 --quantize-base nf4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("q_proj.weight [64, 64] cannot be stored as nf4"), std::string::npos) << r.output;
  r = run(base + " --lora-rank 4 --quantize-base nf4-bnb --save-every 1 --save " + testing::TempDir() + "qlora_bad");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--save-every]"), std::string::npos) << r.output;
  r = run("plan --model llama-tiny --device meta --seq-len 16 --quantize-base nf4-bnb");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("add --lora-rank"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace scalelab
