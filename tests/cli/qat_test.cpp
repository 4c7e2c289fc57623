// QAT end to end (train --qat 8da4w, scalelab quantize) against torchao 0.18
// (tests/golden/data/qat, make_qat_golden.py), its memory plan, and its bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli_run.h"
#include "model/quantize.h"
#include "model/safetensors.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/qat/";

std::string qat_train_flags(const nlohmann::json& e) {
  const nlohmann::json& t = e["training"];
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  return " --micro-batch-size " + i("micro_batch_size") + " --seq-len " + i("seq_len") + " --max-steps " +
         i("max_steps") + " --warmup-steps " + i("warmup_steps") + " --grad-accum-steps " + i("grad_accum_steps") +
         " --lr " + s("lr") + " --lr-scheduler linear --weight-decay " + s("weight_decay") + " --adam-beta1 " +
         s("adam_beta1") + " --adam-beta2 " + s("adam_beta2") + " --adam-epsilon 1e-8 --max-grad-norm " +
         s("max_grad_norm") + " --threads 1 --bench-warmup-steps 0 --quiet --qat 8da4w --qat-group-size " +
         std::to_string(e["qat"]["group_size"].get<std::int64_t>());
}

// The trajectory of torchao's prepared tiny Llama (every linear module of the decoder layers fake-
// quantized, group 32). Both start from the same weights and data and the fake quantization is
// bit-exact (QatKernels.*), so the first step's loss differs only by the GEMMs' summation order
// (within 1e-6; measured 2e-9). After that, a ~1e-7 difference matters where it moves a value
// across a rounding boundary of a quantizer — a whole quantum at once — and AdamW's normalized
// steps carry it on: the trajectory is chaotic at that level in torchao itself. The generator
// measures how far torchao's own losses move when the starting weights move by one ulp
// (expected.json "ulp_spread"); step k must be within twice the largest spread of steps 1..k.
// (TrajectoryUnderFusedKernelsEqualsTorchaos: the same with --fused-kernels, whose fused norms,
// head and recomputed MLP activation change only the order of float operations, so the same
// tolerance holds.)
void expect_torchaos_trajectory(const std::string& extra, const std::string& tag) {
  const std::string dir = kGolden + "trajectory";
  const nlohmann::json e = read_json(dir + "/expected.json");
  const std::string out = testing::TempDir() + "qat_traj" + tag;
  std::filesystem::remove_all(out);
  const auto r = run("train --model " + dir + " --data " + dir + "/tokens.bin" + qat_train_flags(e) + " --save " + out +
                     " --json " + out + ".json" + extra);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json rec = read_json(out + ".json");
  EXPECT_EQ(rec["config"]["qat"], "8da4w");
  // the saved model records its scheme, for scalelab quantize's default group size
  const nlohmann::json qat = read_json(out + "/qat_config.json");
  EXPECT_EQ(qat["scheme"], "8da4w");
  EXPECT_EQ(qat["group_size"], e["qat"]["group_size"]);
  const auto& want = e["losses"];
  const auto& got = rec["losses"];
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, spread = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double w = want[i].get<double>(), g = got[i].get<double>();
    spread = std::max(spread, e["ulp_spread"][i].get<double>());
    const double tol = i == 0 ? 1e-6 : 2 * spread;
    worst = std::max(worst, std::abs(g - w) / std::abs(w));
    EXPECT_NEAR(g, w, tol * std::abs(w)) << "step " << i + 1;
  }
  std::printf("QAT trajectory%s: largest relative loss difference to torchao %.3g\n", extra.c_str(), worst);
}

TEST(QatGolden, TrajectoryEqualsTorchaos) { expect_torchaos_trajectory("", ""); }

TEST(QatGolden, TrajectoryUnderFusedKernelsEqualsTorchaos) {
  expect_torchaos_trajectory(" --fused-kernels", "_fused");
  expect_torchaos_trajectory(" --fused-kernels --activation-checkpointing --attn flash", "_fused_ckpt");
}

// OPT (biases; fc1's bias + ReLU fused into one pass, the fused LayerNorms): the first step's loss
// with --fused-kernels equals the unfused one within the reassociation of fp32 sums (both start
// from the same weights; fake quantization is the same code on inputs that differ by a few ulp),
// and the run goes on. Later steps are not compared: a one-ulp difference that crosses a
// quantizer's rounding boundary moves a value by a whole quantum (see above).
TEST(QatCli, FusedKernelsMatchUnfusedOnOpt) {
  const std::string base = "train --model opt-tiny --seq-len 32 --micro-batch-size 2 --max-steps 2 --threads 1 "
                           "--quiet --qat 8da4w --qat-group-size 32 --bench-warmup-steps 0 --json ";
  const std::string j0 = testing::TempDir() + "qat_opt_plain.json", j1 = testing::TempDir() + "qat_opt_fused.json";
  const auto r0 = run(base + j0);
  ASSERT_EQ(r0.code, 0) << r0.output;
  const auto r1 = run(base + j1 + " --fused-kernels");
  ASSERT_EQ(r1.code, 0) << r1.output;
  const auto a = read_json(j0), b = read_json(j1);
  ASSERT_EQ(b["losses"].size(), 2u);
  const double l0 = a["losses"][0].get<double>(), l1 = b["losses"][0].get<double>();
  EXPECT_NEAR(l1, l0, 1e-5 * std::abs(l0));
  EXPECT_TRUE(std::isfinite(b["losses"][1].get<double>()));
  EXPECT_EQ(b["max_reserved_bytes"], b["memory_plan"]["total_bytes"]);
}

// scalelab quantize on torchao's trained model equals torchao's convert of it, bit for bit: the
// int4 values (unpacked), the fp32 scales and the zero points; every other tensor is copied.
TEST(QatGolden, QuantizeEqualsTorchaosConvert) {
  const SafetensorsFile theirs = SafetensorsFile::open(kGolden + "converted.safetensors");
  for (const std::string to : {"int4", "int8"}) {
    const std::string out = testing::TempDir() + "qat_quantized_" + to;
    std::filesystem::remove_all(out);
    const auto r = run("quantize " + kGolden + "trained --to " + to + " --group-size 32 --out " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("Quantized 14 linear modules"), std::string::npos) << r.output;
    const SafetensorsFile mine = SafetensorsFile::open(out + "/model.safetensors");
    int checked = 0;
    for (const SafetensorsTensor& t : theirs.tensors()) {
      const SafetensorsTensor* m = mine.find(t.name);
      ASSERT_NE(m, nullptr) << t.name;
      if (t.dtype_name == "I8") {  // the weight: int4 values in int8
        std::vector<std::int8_t> q(static_cast<std::size_t>(t.numel()));
        if (to == "int4") {
          ASSERT_EQ(m->dtype_name, "U8");
          ASSERT_EQ(m->shape, (std::vector<std::int64_t>{t.shape[0], t.shape[1] / 2})) << t.name;
          unpack_int4(q.data(), mine.bytes(*m), t.shape[0], t.shape[1]);
        } else {
          ASSERT_EQ(m->dtype_name, "I8");
          ASSERT_EQ(m->shape, t.shape);
          std::memcpy(q.data(), mine.bytes(*m), q.size());
        }
        EXPECT_EQ(std::memcmp(q.data(), theirs.bytes(t), q.size()), 0) << t.name;
      } else {  // scales, zeros: fp32, the same bytes
        ASSERT_EQ(m->dtype_name, t.dtype_name) << t.name;
        ASSERT_EQ(m->shape, t.shape) << t.name;
        EXPECT_EQ(std::memcmp(mine.bytes(*m), theirs.bytes(t), t.end - t.begin), 0) << t.name;
      }
      ++checked;
    }
    EXPECT_EQ(checked, 42);
    // untouched tensors: byte-identical copies
    const SafetensorsFile src = SafetensorsFile::open(kGolden + "trained/model.safetensors");
    for (const char* name :
         {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"}) {
      const SafetensorsTensor* a = src.find(name);
      const SafetensorsTensor* b = mine.find(name);
      ASSERT_TRUE(a && b) << name;
      EXPECT_EQ(std::memcmp(src.bytes(*a), mine.bytes(*b), a->end - a->begin), 0) << name;
    }
    const nlohmann::json cfg = read_json(out + "/config.json");
    EXPECT_EQ(cfg["quantization_config"]["group_size"], 32);
  }
}

TEST(QatCli, MeasuredPeakEqualsThePlan) {
  const std::string json = testing::TempDir() + "qat_peak.json";
  for (const std::string sw : {"", " --activation-checkpointing --attn flash", " --fused-kernels",
                                " --fused-kernels --activation-checkpointing --attn flash"}) {
    const auto r = run("train --model llama-tiny --seq-len 64 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet "
                       "--qat 8da4w --qat-group-size 32 --json " + json + sw);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rec = read_json(json);
    EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]) << sw;
  }
  // QAT's transients are in the plan: on llama-small (seq 256, micro-batch 4) its activations
  // (what the step holds, before the allocator's segments) are above the plain run's. (The totals
  // can round to the same 20 MiB segments.)
  const std::string sz = " --model llama-small --seq-len 256 --micro-batch-size 4 --device meta --json " + json;
  auto activations = [&] {
    const nlohmann::json plan = read_json(json);
    for (const auto& it : plan["items"])
      if (it["name"] == "activations") return it["bytes"].get<std::int64_t>();
    return std::int64_t{0};
  };
  const auto plain = run("plan" + sz);
  ASSERT_EQ(plain.code, 0) << plain.output;
  const auto p0 = activations();
  ASSERT_GT(p0, 0);
  const auto q = run("plan" + sz + " --qat 8da4w");
  ASSERT_EQ(q.code, 0) << q.output;
  EXPECT_GT(activations(), p0);
}

// --save records the QAT scheme beside the weights (for quantize's default group size); a later
// save without --qat into the same directory leaves no stale record.
TEST(QatCli, SaveRecordsTheSchemeAndAPlainSaveRemovesIt) {
  const std::string out = testing::TempDir() + "qat_record";
  std::filesystem::remove_all(out);
  const std::string base = "train --model llama-tiny --seq-len 16 --micro-batch-size 1 --max-steps 1 --quiet --save " + out;
  auto r = run(base + " --qat 8da4w --qat-group-size 32");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(out + "/qat_config.json")["group_size"], 32);
  r = run(base);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(out + "/qat_config.json"));
}

TEST(QatCli, BadInputExitsTwoNamingTheFlag) {
  const std::string base = "train --model llama-tiny --seq-len 16 --micro-batch-size 1 --max-steps 1 --quiet ";
  struct Case {
    std::string args, says;
  } cases[] = {
      {"--qat 8da4w --qat-group-size 48", "[--qat-group-size] 48 does not divide"},
      {"--qat 4w", "[--qat] unknown scheme '4w'"},
      {"--qat 8da4w --qat-group-size 1", "[--qat-group-size] must be > 1"},
      {"--qat 8da4w --qat-group-size 32 --lora-rank 4 --quantize-base nf4-bnb", "[--qat] QAT fake-quantizes a dense"},
  };
  for (const Case& c : cases) {
    const auto r = run(base + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
  const std::string empty = testing::TempDir() + "qat_empty_dir";
  std::filesystem::create_directories(empty);
  auto r = run("quantize " + empty + " --to int4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("has no config.json"), std::string::npos) << r.output;
  r = run("quantize " + kGolden + "trained --to int4 --group-size 48 --out " + testing::TempDir() + "qat_bad_group");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--qat-group-size] 48 does not divide"), std::string::npos) << r.output;
  r = run("quantize " + kGolden + "trained --to int3 --group-size 32 --out " + testing::TempDir() + "qat_bad_to");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--to]"), std::string::npos) << r.output;
}

TEST(QatCli, PackingRoundTrips) {
  std::vector<std::int8_t> q;
  for (int v = -8; v <= 7; ++v) q.push_back(static_cast<std::int8_t>(v));
  std::vector<std::uint8_t> packed(q.size() / 2);
  pack_int4(packed.data(), q.data(), 2, 8);
  EXPECT_EQ(packed[0], 0x98);  // −8 (0x8) low, −7 (0x9) high
  EXPECT_EQ(packed[7], 0x76);  // 6 low, 7 high
  std::vector<std::int8_t> back(q.size());
  unpack_int4(back.data(), packed.data(), 2, 8);
  EXPECT_EQ(back, q);
}

}  // namespace
}  // namespace scalelab
