// LoRA (--lora-rank): the layout (adapters trainable, base frozen), the bad-input refusals, and
// the end-to-end trajectory against peft (tests/golden/data/lora, make_lora_golden.py): scalelab
// starts from peft's initial A and B (--adapter DIR/adapter_init) and must reproduce peft's
// per-step losses within 1e-5 relative, then save an adapter in PEFT's format that equals peft's
// trained one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "cli/cli_run.h"
#include "core/allocator.h"
#include "core/error.h"
#include "model/config.h"
#include "model/init.h"
#include "model/params.h"
#include "model/safetensors.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kGolden = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/lora/";

LoraConfig lora(std::int64_t r, std::vector<std::string> targets = {}) {
  LoraConfig c;
  c.rank = r;
  c.alpha = 16;
  c.targets = std::move(targets);
  return c;
}

TEST(LoraLayout, AdaptersAreTheTrainableBufferAndTheBaseIsFrozen) {
  const ModelConfig cfg = resolve_model("llama-tiny");
  const ParamLayout base = ParamLayout::build(cfg);
  const ParamLayout L = ParamLayout::build(cfg, "", lora(4, {"q_proj", "v_proj", "down_proj"}));
  const std::int64_t H = cfg.hidden_size, I = cfg.intermediate_size, hd = cfg.head_dim;
  const std::int64_t per_layer = 4 * (H + cfg.num_attention_heads * hd)      // q: A [4, H], B [nh·hd, 4]
                                 + 4 * (H + cfg.num_key_value_heads * hd)    // v
                                 + 4 * (I + H);                              // down
  EXPECT_EQ(L.trainable_numel(), per_layer * cfg.num_hidden_layers);
  EXPECT_EQ(L.frozen_numel(), base.total_numel());
  EXPECT_EQ(L.matmul_numel(), base.matmul_numel());  // N of 6N: the base's
  const ParamInfo& a = L.at("model.layers.1.self_attn.q_proj.lora_A.weight");
  EXPECT_TRUE(a.trainable && a.is_adapter && a.decay);
  EXPECT_EQ(a.shape, (Shape{4, H}));
  EXPECT_EQ(L.at("model.layers.0.mlp.down_proj.lora_B.weight").shape, (Shape{H, 4}));
  EXPECT_FALSE(L.at("model.layers.0.self_attn.q_proj.weight").trainable);
  EXPECT_EQ(L.find("model.layers.0.self_attn.k_proj.lora_A.weight"), nullptr);
  for (const ParamInfo& p : L.params()) EXPECT_EQ(p.trainable, p.is_adapter) << p.name;
  EXPECT_DOUBLE_EQ(L.lora().scale(), 4.0);
  LoraConfig rs = lora(4);
  rs.rslora = true;
  EXPECT_DOUBLE_EQ(rs.scale(), 8.0);
}

TEST(LoraLayout, RefusesUnknownTargetsLargeRanksAndFreeze) {
  const ModelConfig cfg = resolve_model("llama-tiny");
  try {
    ParamLayout::build(cfg, "", lora(4, {"q_proj", "qkv"}));
    FAIL() << "no refusal";
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--lora-targets"), std::string::npos) << m;
    EXPECT_NE(m.find("'qkv'"), std::string::npos) << m;
    EXPECT_NE(m.find("down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"), std::string::npos) << m;
  }
  try {
    ParamLayout::build(cfg, "", lora(cfg.hidden_size + 1));
    FAIL() << "no refusal";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--lora-rank"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ParamLayout::build(cfg, "embed", lora(2)), InvalidInput);
}

TEST(LoraInit, AIsKaimingUniformAndBIsZero) {
  const ModelConfig cfg = resolve_model("llama-tiny");
  const ParamLayout L = ParamLayout::build(cfg, "", lora(8));
  DeviceAllocator alloc(make_host_backend(), std::size_t{1} << 30);
  Tensor flat = Tensor::empty({L.total_numel()}, DType::kF32, alloc, "test");
  init_params(flat, L, cfg, 7);
  const ParamInfo& a = L.at("model.layers.0.self_attn.q_proj.lora_A.weight");
  const ParamInfo& b = L.at("model.layers.0.self_attn.q_proj.lora_B.weight");
  const float* pa = flat.data<float>() + a.offset;
  const double bound = 1.0 / std::sqrt(static_cast<double>(cfg.hidden_size));
  double mean = 0, sq = 0;
  for (std::int64_t i = 0; i < a.numel; ++i) {
    ASSERT_LE(std::abs(pa[i]), bound);
    mean += pa[i];
    sq += static_cast<double>(pa[i]) * pa[i];
  }
  mean /= static_cast<double>(a.numel);
  sq /= static_cast<double>(a.numel);
  // U(-b, b): mean 0, variance b²/3 (within a few standard errors for this many draws).
  EXPECT_NEAR(mean, 0.0, 4 * bound / std::sqrt(3.0 * static_cast<double>(a.numel)));
  EXPECT_NEAR(sq, bound * bound / 3, 0.1 * bound * bound / 3);
  for (std::int64_t i = 0; i < b.numel; ++i) ASSERT_EQ(flat.data<float>()[b.offset + i], 0.0f);
}

std::string lora_flags(const nlohmann::json& e) {
  const auto& l = e["lora"];
  std::string targets;
  for (const auto& t : l["targets"]) {
    if (!targets.empty()) targets += ',';
    targets += t.get<std::string>();
  }
  std::string f = " --lora-rank " + std::to_string(l["r"].get<int>()) + " --lora-alpha " +
                  std::to_string(l["alpha"].get<double>()) + " --lora-targets " + targets;
  if (l["rslora"].get<bool>()) f += " --rslora";
  return f;
}

std::string train_flags(const nlohmann::json& t) {
  auto s = [&](const char* k) { return std::to_string(t[k].get<double>()); };
  auto i = [&](const char* k) { return std::to_string(t[k].get<std::int64_t>()); };
  return " --micro-batch-size " + i("micro_batch_size") + " --seq-len " + i("seq_len") + " --max-steps " +
         i("max_steps") + " --warmup-steps " + i("warmup_steps") + " --grad-accum-steps " + i("grad_accum_steps") +
         " --lr " + s("lr") + " --lr-scheduler linear --weight-decay " + s("weight_decay") + " --adam-beta1 " +
         s("adam_beta1") + " --adam-beta2 " + s("adam_beta2") + " --adam-epsilon 1e-8 --max-grad-norm " +
         s("max_grad_norm") + " --threads 1 --bench-warmup-steps 0 --quiet";
}

class LoraGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraGolden, TrajectoryEqualsPeftAndTheSavedAdapterEqualsPefts) {
  const std::string dir = kGolden + GetParam();
  const nlohmann::json e = read_json(dir + "/expected.json");
  const std::string out = testing::TempDir() + "lora_" + GetParam();
  std::filesystem::remove_all(out);
  const std::string json = out + ".json";
  const auto r = run("train --model " + dir + " --data " + dir + "/tokens.bin" + train_flags(e["training"]) +
                     lora_flags(e) + " --adapter " + dir + "/adapter_init --save " + out + " --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json rec = read_json(json);
  EXPECT_EQ(rec["trainable_params"].get<std::int64_t>(), e["trainable_params"].get<std::int64_t>());
  EXPECT_EQ(rec["params"].get<std::int64_t>(), e["total_params"].get<std::int64_t>());
  const auto& want = e["losses"];
  const auto& got = rec["losses"];
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double w = want[i].get<double>(), g = got[i].get<double>();
    EXPECT_NEAR(g, w, 1e-5 * std::abs(w)) << "step " << i + 1;
  }
  // The saved adapter: peft's names and shapes, and the values peft trained.
  const SafetensorsFile mine = SafetensorsFile::open(out + "/adapter_model.safetensors");
  const SafetensorsFile theirs = SafetensorsFile::open(dir + "/adapter_final/adapter_model.safetensors");
  ASSERT_EQ(mine.tensors().size(), theirs.tensors().size());
  for (const SafetensorsTensor& t : theirs.tensors()) {
    const SafetensorsTensor* m = mine.find(t.name);
    ASSERT_NE(m, nullptr) << t.name;
    ASSERT_EQ(m->shape, t.shape) << t.name;
    std::vector<float> a(static_cast<std::size_t>(t.numel())), b(a.size());
    mine.read(*m, a.data(), DType::kF32);
    theirs.read(t, b.data(), DType::kF32);
    double maxabs = 0, maxdiff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      maxabs = std::max(maxabs, std::abs(static_cast<double>(b[i])));
      maxdiff = std::max(maxdiff, std::abs(static_cast<double>(a[i]) - b[i]));
    }
    // Six AdamW steps normalize each gradient element, so fp32 rounding differences in a small
    // gradient can move an element by more than they move the loss; relative to the tensor's largest
    // element it stays near 1e-5.
    EXPECT_LE(maxdiff, 2e-4 * std::max(maxabs, 1e-2)) << t.name;  // measured: <= 2e-5
  }
  const nlohmann::json cfg = read_json(out + "/adapter_config.json");
  EXPECT_EQ(cfg["peft_type"], "LORA");
  // base_model_name_or_path is the base's absolute directory: merge finds it without --model.
  EXPECT_EQ(cfg["base_model_name_or_path"], std::filesystem::absolute(dir).string());
  std::filesystem::remove_all(out + "_merged");
  const auto m = run("merge " + out + " --into " + out + "_merged");
  EXPECT_EQ(m.code, 0) << m.output;
  EXPECT_EQ(cfg["r"], e["lora"]["r"]);
  EXPECT_EQ(cfg["use_rslora"], e["lora"]["rslora"]);
}

INSTANTIATE_TEST_SUITE_P(Peft, LoraGolden,
                         ::testing::Values("llama_gqa_tied_qv", "llama_gqa_tied_all_rslora_accum2",
                                           "opt_biases_attn_mlp"));

// The engine's switches still combine with LoRA: flash attention and activation checkpointing
// change no math (fp32: the same trajectory within 1e-5); bf16 autocast rounds the activations
// (within 1e-2 of fp32 over six steps); --fused-kernels (fused norms, the chunked linear +
// cross-entropy with the frozen tied head, the MLP backward unfused where down_proj has an
// adapter) changes only the order of fp32 sums: the same trajectory within 1e-5.
TEST(LoraCli, SwitchesCombine) {
  // OPT (biases, LoRA on attention and fc1/fc2; the fused bias+ReLU and the frozen untied head).
  {
    const std::string dir = kGolden + "opt_biases_attn_mlp";
    const nlohmann::json e = read_json(dir + "/expected.json");
    const std::string json = testing::TempDir() + "lora_switch_opt.json";
    const auto r = run("train --model " + dir + " --data " + dir + "/tokens.bin" + train_flags(e["training"]) +
                       lora_flags(e) + " --adapter " + dir + "/adapter_init --json " + json + " --fused-kernels");
    ASSERT_EQ(r.code, 0) << r.output;
    const auto got = read_json(json)["losses"];
    ASSERT_EQ(got.size(), e["losses"].size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double w = e["losses"][i].get<double>();
      EXPECT_NEAR(got[i].get<double>(), w, 1e-5 * w) << "opt --fused-kernels step " << i + 1;
    }
  }
  const std::string dir = kGolden + "llama_gqa_tied_all_rslora_accum2";
  const nlohmann::json e = read_json(dir + "/expected.json");
  const std::string json = testing::TempDir() + "lora_switch.json";
  const std::string base = "train --model " + dir + " --data " + dir + "/tokens.bin" + train_flags(e["training"]) +
                           lora_flags(e) + " --adapter " + dir + "/adapter_init --json " + json;
  for (const auto& [sw, tol] : std::vector<std::pair<std::string, double>>{
           {"--attn flash --activation-checkpointing", 1e-5}, {"--mixed-precision bf16", 1e-2},
           {"--fused-kernels", 1e-5}, {"--fused-kernels --attn flash --activation-checkpointing", 1e-5}}) {
    const auto r = run(base + " " + sw);
    ASSERT_EQ(r.code, 0) << sw << "\n" << r.output;
    const auto got = read_json(json)["losses"];
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double w = e["losses"][i].get<double>();
      EXPECT_NEAR(got[i].get<double>(), w, tol * w) << sw << " step " << i + 1;
    }
  }
}

// The plan (the real model on the meta device) is the measured peak, adapters included.
TEST(LoraCli, MeasuredPeakEqualsThePlan) {
  const std::string json = testing::TempDir() + "lora_peak.json";
  for (const std::string sw : {"", " --activation-checkpointing --attn flash --mixed-precision bf16",
                               " --fused-kernels --mixed-precision bf16"}) {
    const auto r = run("train --model llama-tiny --seq-len 64 --micro-batch-size 2 --max-steps 2 --threads 1 --quiet "
                       "--lora-rank 8 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --json " +
                       json + sw);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rec = read_json(json);
    EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]) << sw;
    EXPECT_GT(rec["trainable_params"].get<std::int64_t>(), 0);
    EXPECT_EQ(rec["frozen_params"].get<std::int64_t>() + rec["trainable_params"].get<std::int64_t>(),
              rec["params"].get<std::int64_t>());
  }
}

// scalelab generate --adapter: the settings come from adapter_config.json; greedy tokens equal
// peft's generate with the same trained adapter (expected.json "generate", whose smallest top-1 /
// top-2 logit gap is far above fp32 rounding).
TEST_P(LoraGolden, GenerateWithTheAdapterEqualsPeft) {
  const std::string dir = kGolden + GetParam();
  const nlohmann::json g = read_json(dir + "/expected.json")["generate"];
  std::string prompt, want;
  for (const auto& t : g["prompt_ids"]) {
    if (!prompt.empty()) prompt += ',';
    prompt += std::to_string(t.get<int>());
  }
  for (const auto& t : g["tokens"]) {
    want += ' ';
    want += std::to_string(t.get<int>());
  }
  const std::string json = testing::TempDir() + "lora_gen_" + std::string(GetParam()) + ".json";
  const auto r = run("generate --model " + dir + " --adapter " + dir + "/adapter_final --prompt-ids " + prompt +
                     " --max-new-tokens " + std::to_string(g["max_new_tokens"].get<int>()) + " --no-eos --quiet --json " +
                     json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("=>" + want + "\n"), std::string::npos) << r.output << "\nwant:" << want;
  EXPECT_EQ(read_json(json)["adapter"], dir + "/adapter_final");
}

// scalelab merge: every adapted weight is W + s·B·A (checked against a double-precision product
// from the files, within fp32 rounding of the sum), every other tensor byte-identical, and the
// merged model generates peft's greedy tokens without an adapter.
TEST_P(LoraGolden, MergeFoldsTheAdapterIntoTheBase) {
  const std::string dir = kGolden + GetParam();
  const nlohmann::json e = read_json(dir + "/expected.json");
  const std::string out = testing::TempDir() + "lora_merged_" + GetParam();
  std::filesystem::remove_all(out);
  auto r = run("merge " + dir + "/adapter_final --model " + dir + " --into " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const SafetensorsFile base = SafetensorsFile::open(dir + "/model.safetensors");
  const SafetensorsFile merged = SafetensorsFile::open(out + "/model.safetensors");
  const SafetensorsFile ad = SafetensorsFile::open(dir + "/adapter_final/adapter_model.safetensors");
  const double r_ = e["lora"]["r"].get<double>(), alpha = e["lora"]["alpha"].get<double>();
  const double s = e["lora"]["rslora"].get<bool>() ? alpha / std::sqrt(r_) : alpha / r_;
  auto read = [](const SafetensorsFile& f, const SafetensorsTensor& t) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    f.read(t, v.data(), DType::kF32);
    return v;
  };
  int adapted = 0;
  ASSERT_EQ(merged.tensors().size(), base.tensors().size());
  for (const SafetensorsTensor& t : base.tensors()) {
    const SafetensorsTensor* m = merged.find(t.name);
    ASSERT_NE(m, nullptr) << t.name;
    const std::vector<float> w = read(base, t), got = read(merged, *m);
    const std::string module = t.name.substr(0, t.name.size() - 7);
    const SafetensorsTensor* a = ad.find("base_model.model." + module + ".lora_A.weight");
    if (a == nullptr) {
      EXPECT_EQ(w, got) << t.name;
      continue;
    }
    ++adapted;
    const std::vector<float> A = read(ad, *a), B = read(ad, *ad.find("base_model.model." + module + ".lora_B.weight"));
    const std::int64_t out_f = t.shape[0], in = t.shape[1], rank = a->shape[0];
    for (std::int64_t o = 0; o < out_f; ++o)
      for (std::int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (std::int64_t k = 0; k < rank; ++k) d += static_cast<double>(B[o * rank + k]) * A[k * in + i];
        const double want = w[o * in + i] + s * d;
        ASSERT_NEAR(got[o * in + i], want, 1e-6 * (1 + std::abs(want))) << t.name << " [" << o << ", " << i << "]";
      }
  }
  EXPECT_EQ(adapted, 2 * static_cast<int>(e["lora"]["targets"].size()));  // two layers
  const nlohmann::json g = e["generate"];
  std::string prompt, want;
  for (const auto& t : g["prompt_ids"]) {
    if (!prompt.empty()) prompt += ',';
    prompt += std::to_string(t.get<int>());
  }
  for (const auto& t : g["tokens"]) {
    want += ' ';
    want += std::to_string(t.get<int>());
  }
  r = run("generate --model " + out + " --prompt-ids " + prompt + " --max-new-tokens 8 --no-eos --quiet");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("=>" + want + "\n"), std::string::npos) << r.output;
  // No base model to be found: exit 2 naming --model.
  r = run("merge " + dir + "/adapter_final --into " + out + "_x");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--model]"), std::string::npos) << r.output;
}

TEST(LoraCli, GenerateRefusesAnAdapterOfAnotherModel) {
  const auto r = run("generate --model " + kGolden + "llama_gqa_tied_qv --adapter " + kGolden +
                     "opt_biases_attn_mlp/adapter_final --prompt-ids 1,2 --max-new-tokens 2 --quiet");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--adapter]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'fc1' matches no linear module"), std::string::npos) << r.output;
}

// --save-every / --resume under LoRA: the checkpoint holds base + adapters + the adapters' AdamW
// states; resuming at step 3 of 6 gives the same losses and a byte-identical saved adapter.
TEST(LoraCli, ResumeIsBitIdentical) {
  const std::string dir = kGolden + "llama_gqa_tied_all_rslora_accum2";
  const nlohmann::json e = read_json(dir + "/expected.json");
  const std::string a = testing::TempDir() + "lora_resume_a", b = testing::TempDir() + "lora_resume_b";
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
  const std::string base = "train --model " + dir + " --data " + dir + "/tokens.bin" + train_flags(e["training"]) +
                           lora_flags(e) + " --adapter " + dir + "/adapter_init";
  auto r = run(base + " --save " + a + " --save-every 3 --json " + a + ".json");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(base + " --resume " + a + "/checkpoint-3 --save " + b + " --json " + b + ".json");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto la = read_json(a + ".json")["losses"], lb = read_json(b + ".json")["losses"];
  ASSERT_EQ(lb.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(lb[i].get<double>(), la[i + 3].get<double>()) << i;
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(bytes(a + "/adapter_model.safetensors"), bytes(b + "/adapter_model.safetensors"));
  // Other LoRA settings than the checkpoint's: refused, naming them.
  r = run("train --model " + dir + " --data " + dir + "/tokens.bin" + train_flags(e["training"]) +
          " --lora-rank 4 --resume " + a + "/checkpoint-3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("lora"), std::string::npos) << r.output;
}

TEST(LoraCli, BadInputExitsTwoNamingTheFlag) {
  const std::string dir = kGolden + "llama_gqa_tied_qv";
  const std::string base = "train --model " + dir + " --data " + dir + "/tokens.bin --max-steps 1 --seq-len 16 --quiet";
  auto r = run(base + " --lora-rank 4 --lora-targets q_proj,attn");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'attn' matches no linear module"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("q_proj,up_proj,v_proj"), std::string::npos) << r.output;
  r = run(base + " --lora-rank 65");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--lora-rank] 65 is above a dimension"), std::string::npos) << r.output;
  r = run(base + " --lora-targets q_proj");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("add --lora-rank"), std::string::npos) << r.output;
  r = run(base + " --lora-rank 4 --lora-dropout 1.5");  // P must be in [0, 1)
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--lora-dropout]"), std::string::npos) << r.output;
  // An adapter of another rank / targets.
  r = run(base + " --lora-rank 8 --adapter " + dir + "/adapter_init");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("[--adapter]"), std::string::npos) << r.output;
  r = run(base + " --lora-rank 4 --lora-alpha 8 --lora-targets q_proj --adapter " + dir + "/adapter_init");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("v_proj.lora_A.weight', which this model"), std::string::npos) << r.output;
}

TEST(LoraCli, PlanShowsTheDropOfWeightsGradientsAndOptimizerStates) {
  const std::string full = testing::TempDir() + "lora_plan_full.json", lo = testing::TempDir() + "lora_plan_r8.json";
  const std::string common = "plan --model llama-small --seq-len 32 --micro-batch-size 1 --device meta";
  auto r = run(common + " --json " + full);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(common + " --lora-rank 8 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --json " + lo);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("frozen by the LoRA base"), std::string::npos) << r.output;
  const auto a = read_json(full), b = read_json(lo);
  auto item = [](const nlohmann::json& p, const std::string& name) -> std::int64_t {
    for (const auto& it : p["items"])
      if (it["name"] == name) return it["bytes"].get<std::int64_t>();
    return -1;
  };
  // Gradients and AdamW states exist for the adapters only; weights grow by them.
  EXPECT_EQ(b["trainable_params"].get<std::int64_t>() + a["params"].get<std::int64_t>(), b["params"].get<std::int64_t>());
  EXPECT_EQ(item(b, "gradients"), 4 * b["trainable_params"].get<std::int64_t>()) << b.dump(1);
  EXPECT_LT(b["total_bytes"].get<std::int64_t>(), a["total_bytes"].get<std::int64_t>());
}

}  // namespace
}  // namespace scalelab
