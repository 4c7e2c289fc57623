// QLoRA (--quantize-base nf4 | nf4-bnb): the end-to-end trajectory against the torchtune-style
// golden (tests/golden/data/nf4/qlora, make_nf4_golden.py: transformers' Llama with every projection
// a QLoRA linear over torchao's NF4Tensor, or over bitsandbytes' quantize_4bit, from the same A and
// B), the run record, the measured peak against the plan, the plan's bytes per quantized parameter,
// and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "model/safetensors.h"

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
  r = run("plan --model llama-tiny --device meta --seq-len 16 --quantize-base nf4-bnb");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("add --lora-rank"), std::string::npos) << r.output;
}

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

std::string file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// --save-every / --resume with an NF4 base: the checkpoint holds the dense parameters and the
// adapters (not the quantized weights), the base is re-quantized from --model on resume and
// checked by its CRC-32, and the continuation is bit for bit the uninterrupted run's (losses,
// gradient norms, the saved adapter) for both flavours.
TEST(QloraCli, ResumeIsBitIdentical) {
  const nlohmann::json e = read_json(kGolden + "/expected_nf4.json");
  for (const std::string flavor : {"nf4", "nf4-bnb"}) {
    const std::string a = testing::TempDir() + "qlora_resume_a_" + flavor, b = testing::TempDir() + "qlora_resume_b_" + flavor;
    std::filesystem::remove_all(a);
    std::filesystem::remove_all(b);
    const std::string base = "train --model " + kGolden + " --data " + kGolden + "/tokens.bin" + train_flags(e["training"]) +
                             " --lora-rank 8 --lora-alpha 16 --lora-targets " + kAll + " --quantize-base " + flavor +
                             " --adapter " + kGolden + "/adapter_init";
    auto r = run(base + " --save " + a + " --save-every 2 --json " + a + ".json");
    ASSERT_EQ(r.code, 0) << r.output;
    const std::string ckpt = a + "/checkpoint-2";
    // The checkpoint: no quantized weight in model.safetensors, the base's checksum recorded.
    const std::string model = file_bytes(ckpt + "/model.safetensors");
    EXPECT_EQ(model.find("q_proj.weight\""), std::string::npos) << "the NF4 weights are not saved";
    EXPECT_NE(model.find("embed_tokens.weight"), std::string::npos);
    EXPECT_NE(model.find("q_proj.lora_A.weight"), std::string::npos);
    const auto state = read_json(ckpt + "/trainer_state.json");
    ASSERT_TRUE(state.contains("rebuilt_from_model")) << state.dump();
    EXPECT_EQ(state["rebuilt_from_model"]["nf4_base"]["crc32"].get<std::string>().size(), 8u);
    r = run(base + " --resume " + ckpt + " --save " + b + " --json " + b + ".json");
    ASSERT_EQ(r.code, 0) << r.output;
    const auto ra = read_json(a + ".json"), rb = read_json(b + ".json");
    const std::size_t n = ra["losses"].size();
    ASSERT_EQ(rb["losses"].size(), n - 2);
    for (std::size_t i = 0; i + 2 < n; ++i) {
      EXPECT_EQ(rb["losses"][i].get<double>(), ra["losses"][i + 2].get<double>()) << flavor << " step " << i + 3;
      EXPECT_EQ(rb["grad_norms"][i].get<double>(), ra["grad_norms"][i + 2].get<double>()) << flavor;
    }
    EXPECT_EQ(file_bytes(a + "/adapter_model.safetensors"), file_bytes(b + "/adapter_model.safetensors")) << flavor;
  }
  // Another base under the same config (one weight changed): its NF4 codes differ — refused.
  const std::string other = testing::TempDir() + "qlora_other_base";
  std::filesystem::remove_all(other);
  std::filesystem::create_directories(other);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    std::filesystem::copy_file(kGolden + "/" + f, other + "/" + f);
  // The first element of a quantized weight made large enough to set its block's absmax: its codes change.
  set_first_f32(other + "/model.safetensors", "model.layers.0.self_attn.q_proj.weight", 3.0f);
  const auto r = run("train --model " + other + " --data " + kGolden + "/tokens.bin" + train_flags(e["training"]) +
                     " --lora-rank 8 --lora-alpha 16 --lora-targets " + kAll + " --quantize-base nf4 --adapter " +
                     kGolden + "/adapter_init --resume " + testing::TempDir() + "qlora_resume_a_nf4/checkpoint-2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the QLoRA base in nf4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resume with that run's --model"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace scalelab
