// QAT + LoRA (train --qat 8da4w --lora-rank R): torchtune's QATLoRALinear — the frozen base weight
// and the layer input fake-quantized, the adapters in full precision on the unquantized input —
// against the reference of tests/golden/make_qat_lora_golden.py (tests/golden/data/qat_lora), its
// memory plan, merge + quantize of the result, and its bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/cli_run.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/qat_lora";

std::string flags(const nlohmann::json& e) {
  const nlohmann::json& t = e["training"];
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  std::string targets;
  for (const auto& x : e["lora"]["targets"]) {
    if (!targets.empty()) targets += ',';
    targets += x.get<std::string>();
  }
  return " --micro-batch-size " + i("micro_batch_size") + " --seq-len " + i("seq_len") + " --max-steps " +
         i("max_steps") + " --warmup-steps " + i("warmup_steps") + " --grad-accum-steps " + i("grad_accum_steps") +
         " --lr " + s("lr") + " --lr-scheduler linear --weight-decay " + s("weight_decay") + " --adam-beta1 " +
         s("adam_beta1") + " --adam-beta2 " + s("adam_beta2") + " --adam-epsilon 1e-8 --max-grad-norm " +
         s("max_grad_norm") + " --threads 1 --bench-warmup-steps 0 --quiet --lora-rank " +
         std::to_string(e["lora"]["r"].get<int>()) + " --lora-alpha " + std::to_string(e["lora"]["alpha"].get<double>()) +
         " --lora-targets " + targets + " --adapter " + kGolden + "/adapter_init";
}

std::string qat_flags(const nlohmann::json& e) {
  return " --qat 8da4w --qat-group-size " + std::to_string(e["qat"]["group_size"].get<std::int64_t>());
}

// The reference's losses against scalelab's from the same base, adapters and tokens. The first
// step differs only by the GEMMs' summation order around bit-exact fake quantization (within
// 1e-6). After it, a ~1e-7 difference matters where it moves an activation across a rounding
// boundary of its int8 quantizer (the frozen base's int4 weights never change, so they are
// bit-exact throughout), and AdamW's normalized steps carry it on; the generator measures how far
// the reference itself moves from adapters one ulp away (expected.json "ulp_spread"): step k
// must be within twice the largest spread of steps 1..k (and 1e-6).
double worst_step_error(const nlohmann::json& e, const nlohmann::json& rec, bool check) {
  const auto& want = e["losses"];
  const auto& got = rec["losses"];
  EXPECT_EQ(got.size(), want.size());
  double worst = 0, spread = 0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double w = want[i].get<double>(), g = got[i].get<double>();
    spread = std::max(spread, e["ulp_spread"][i].get<double>());
    const double tol = std::max(1e-6, i == 0 ? 0.0 : 2 * spread);
    const double rel = std::abs(g - w) / std::abs(w);
    worst = std::max(worst, rel / tol);
    if (check) {
      EXPECT_LE(rel, tol) << "step " << i + 1 << ": " << g << " vs the reference's " << w;
    }
  }
  return worst;  // the largest error in units of its tolerance
}

TEST(QatLoraGolden, TrajectoryEqualsTorchtunesQatLora) {
  const nlohmann::json e = read_json(kGolden + "/expected.json");
  const std::string base = "train --model " + kGolden + " --data " + kGolden + "/tokens.bin" + flags(e);
  for (const std::string sw : {"", " --fused-kernels", " --fused-kernels --activation-checkpointing --attn flash"}) {
    const std::string out = testing::TempDir() + "qat_lora_traj";
    std::filesystem::remove_all(out);
    const auto r = run(base + qat_flags(e) + " --save " + out + " --json " + out + ".json" + sw);
    ASSERT_EQ(r.code, 0) << sw << "\n" << r.output;
    const nlohmann::json rec = read_json(out + ".json");
    EXPECT_EQ(rec["config"]["qat"], "8da4w");
    const double worst = worst_step_error(e, rec, true);
    std::printf("QAT + LoRA trajectory%s: largest error %.3g of its tolerance\n", sw.c_str(), worst);
    // --save writes the adapter only (the base is frozen): PEFT's format, as plain LoRA.
    EXPECT_TRUE(std::filesystem::is_regular_file(out + "/adapter_model.safetensors")) << sw;
    EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors")) << sw;
  }
  // The test can tell QAT from no QAT: plain LoRA from the same adapters is outside the tolerance.
  const std::string json = testing::TempDir() + "qat_lora_without_qat.json";
  const auto r = run(base + " --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_GT(worst_step_error(e, read_json(json), false), 1.0);
}

TEST(QatLoraCli, MeasuredPeakEqualsThePlan) {
  const std::string json = testing::TempDir() + "qat_lora_peak.json";
  for (const std::string sw : {"", " --activation-checkpointing --attn flash --fused-kernels"}) {
    const auto r = run("train --model llama-tiny --seq-len 64 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet "
                       "--qat 8da4w --qat-group-size 32 --lora-rank 8 --lora-targets "
                       "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --json " + json + sw);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rec = read_json(json);
    EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]) << sw;
  }
}

// DPO over QAT + LoRA (the reference = the same fake-quantized network with its adapters off):
// it runs, and the measured peak equals the plan.
TEST(QatLoraCli, DpoRunsAndItsPeakEqualsThePlan) {
  const std::string dir = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/dpo/full_accum2";
  const std::string json = testing::TempDir() + "qat_lora_dpo.json";
  const auto r = run("dpo --model " + dir + " --pairs " + dir + "/pairs.jsonl --seq-len 32 --micro-batch-size 2 "
                     "--max-steps 2 --lora-rank 4 --qat 8da4w --qat-group-size 32 --threads 1 --quiet --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto rec = read_json(json);
  EXPECT_EQ(rec["status"], "ok");
  EXPECT_EQ(rec["config"]["qat"], "8da4w");
  EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]);
}

// The recipe's end: merge the adapters into the base, then convert the merged model to int4.
TEST(QatLoraCli, MergedResultQuantizesToInt4) {
  const nlohmann::json e = read_json(kGolden + "/expected.json");
  const std::string out = testing::TempDir() + "qat_lora_merge_src";
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(out + "_merged");
  std::filesystem::remove_all(out + "_int4");
  auto r = run("train --model " + kGolden + " --data " + kGolden + "/tokens.bin" + flags(e) + qat_flags(e) +
               " --max-steps 2 --save " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  // the adapter directory records the QAT scheme, and merge carries the record to the merged model
  EXPECT_EQ(read_json(out + "/qat_config.json")["group_size"], 32);
  r = run("merge " + out + " --into " + out + "_merged --model " + kGolden);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(out + "_merged/qat_config.json")["group_size"], 32);
  // so quantize converts at the trained group size unasked (its default, 256, divides none of the
  // tiny model's 64 input features: without the record this exits 2)
  r = run("quantize " + out + "_merged --to int4 --out " + out + "_int4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Quantized 14 linear modules"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(group size 32)"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::is_regular_file(out + "_int4/model.safetensors"));
  // asked for another group size, it converts with that one and says the training used 32
  std::filesystem::remove_all(out + "_int4");
  r = run("quantize " + out + "_merged --to int4 --group-size 16 --out " + out + "_int4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("was trained with --qat-group-size 32"), std::string::npos) << r.output;
  // a record that is not one: exit 2 naming the file
  {
    std::ofstream bad(out + "_merged/qat_config.json");
    bad << "{\"group_size\": \"thirty-two\"}\n";
  }
  r = run("quantize " + out + "_merged --to int4 --out " + out + "_int4b");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("qat_config.json is not a QAT record"), std::string::npos) << r.output;
}

TEST(QatLoraCli, QatOverAnNf4BaseIsRefused) {
  for (const std::string cmd : {"train --max-steps 1", "plan --device meta"}) {
    const auto r = run(cmd + " --model llama-tiny --seq-len 16 --micro-batch-size 1 --quiet --qat 8da4w "
                             "--qat-group-size 32 --lora-rank 4 --quantize-base nf4-bnb");
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("[--qat] QAT fake-quantizes a dense base"), std::string::npos) << cmd << "\n"
                                                                                              << r.output;
  }
}

}  // namespace
}  // namespace scalelab
