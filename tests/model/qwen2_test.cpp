// Qwen2, the family added through the recipe of docs/adding-a-model.md: presets with the
// published shapes, config.json in and out (and what it refuses), the layout with q/k/v biases,
// checkpoints, the padding row, and the memory plan (Llama's replay, exact) against measured
// peaks. The numerics against transformers are in golden_test.cpp (qwen2_gqa_tied_bias_accum2)
// and the switches in switches_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/family.h"
#include "model/init.h"
#include "model_test_util.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

using ::testing::HasSubstr;
using testing::host_alloc;

TEST(Qwen2, Qwen25HalfBillionHasThePublishedShapeAndSize) {
  const ModelConfig c = preset_config("qwen2.5-0.5b");
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_attention_heads, 14);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  // Qwen2.5-0.5B's published parameter count (tied embeddings).
  EXPECT_EQ(ParamLayout::build(c).total_numel(), 494032768);
  for (const char* p : {"qwen2-tiny", "qwen2-small"}) EXPECT_EQ(preset_config(p).family, ModelFamily::kQwen2);
}

TEST(Qwen2, LayoutHasQkvBiasesAndNoOutputBias) {
  const ModelConfig c = preset_config("qwen2-tiny");
  const ParamLayout L = ParamLayout::build(c);
  const std::string p = "model.layers.1.self_attn.";
  const ParamInfo& qb = L.at(p + "q_proj.bias");
  const ParamInfo& kb = L.at(p + "k_proj.bias");
  const ParamInfo& vb = L.at(p + "v_proj.bias");
  EXPECT_EQ(qb.shape, Shape({c.q_dim()}));
  EXPECT_EQ(kb.shape, Shape({c.kv_dim()}));
  EXPECT_EQ(kb.offset, qb.offset + qb.numel);  // one bias vector for the fused q/k/v GEMM
  EXPECT_EQ(vb.offset, kb.offset + kb.numel);
  EXPECT_EQ(L.at(p + "v_proj.weight").offset + L.at(p + "v_proj.weight").numel, qb.offset);
  for (const ParamInfo* b : {&qb, &kb, &vb}) {
    EXPECT_TRUE(b->is_bias);
    EXPECT_FALSE(b->decay);
  }
  EXPECT_EQ(L.find(p + "o_proj.bias"), nullptr);
  EXPECT_EQ(L.find("model.layers.0.mlp.up_proj.bias"), nullptr);
  EXPECT_EQ(L.find("lm_head.weight"), nullptr);  // tied
  // Llama's layout plus the biases.
  ModelConfig llama = preset_config("llama-tiny");
  EXPECT_EQ(L.total_numel(), ParamLayout::build(llama).total_numel() + 2 * (c.q_dim() + 2 * c.kv_dim()));
  EXPECT_EQ(L.matmul_numel(), ParamLayout::build(llama).matmul_numel());
}

TEST(Qwen2, ConfigJsonInAndOut) {
  const ModelConfig c = preset_config("qwen2-tiny");
  const nlohmann::json j = c.to_hf_json();
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_FALSE(j.contains("head_dim"));
  const ModelConfig back = config_from_hf_json(j, "qwen2.json");
  EXPECT_TRUE(back.qkv_bias);
  EXPECT_EQ(back.head_dim, 16);
  // Qwen2Config's defaults where config.json is silent.
  nlohmann::json minimal = {{"model_type", "qwen2"},      {"hidden_size", 64},     {"intermediate_size", 128},
                            {"num_hidden_layers", 2},     {"num_attention_heads", 4}, {"vocab_size", 256}};
  const ModelConfig d = config_from_hf_json(minimal, "min.json");
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.max_position_embeddings, 32768);
  EXPECT_EQ(d.rope_theta, 10000.0);
  EXPECT_EQ(d.rms_norm_eps, 1e-6);
  EXPECT_FALSE(d.tie_word_embeddings);
  EXPECT_FALSE(d.pad_token_id.has_value());
  auto refused = [&](nlohmann::json patch, const std::string& what) {
    nlohmann::json k = minimal;
    k.update(patch);
    try {
      config_from_hf_json(k, "bad.json");
      ADD_FAILURE() << patch.dump() << " accepted";
    } catch (const InvalidInput& e) {
      EXPECT_THAT(e.what(), HasSubstr(what)) << patch.dump();
      EXPECT_THAT(e.what(), HasSubstr("bad.json"));
    }
  };
  refused({{"use_sliding_window", true}}, "use_sliding_window true is not supported");
  refused({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}, "rope_scaling");
  refused({{"head_dim", 32}}, "Qwen2 derives head_dim");
  refused({{"hidden_act", "gelu"}}, "Qwen2 uses silu");
  refused({{"attention_dropout", 0.1}}, "attention_dropout");
  refused({{"pad_token_id", 300}}, "pad_token_id 300 is outside the vocabulary");
}

TEST(Qwen2, PaddingRowIsZeroAtInitAndCheckpointsRoundTrip) {
  ModelConfig c = preset_config("qwen2-tiny");
  c.pad_token_id = 3;
  const ParamLayout L = ParamLayout::build(c);
  Tensor a = Tensor::empty({L.total_numel()}, DType::kF32, host_alloc());
  init_params(a, L, c, 11);
  const Tensor emb = L.view(a, "model.embed_tokens.weight");
  for (std::int64_t i = 0; i < c.hidden_size; ++i) EXPECT_EQ(emb.f32()[3 * c.hidden_size + i], 0.0f);
  EXPECT_NE(emb.f32()[2 * c.hidden_size], 0.0f);
  for (std::int64_t i = 0; i < L.at("model.layers.0.self_attn.q_proj.bias").numel; ++i)
    EXPECT_EQ(L.view(a, "model.layers.0.self_attn.q_proj.bias").f32()[i], 0.0f);  // biases start at 0
  testing::ScratchDir dir;
  save_checkpoint(dir.str(), c, L, a, {DType::kF32, 20000});
  const ModelConfig c2 = load_config_dir(dir.str());
  EXPECT_EQ(c2.family, ModelFamily::kQwen2);
  EXPECT_EQ(c2.pad_token_id, std::optional<std::int64_t>(3));
  Tensor b = Tensor::zeros({L.total_numel()}, DType::kF32, host_alloc());
  const LoadSummary s = load_weights(dir.str(), c2, L, b);
  EXPECT_GE(s.files.size(), 2u);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

// The memory plan replays the Llama decoder for Qwen2 (its biases allocate nothing): the
// prediction is the measured peak, byte for byte, and `scalelab plan` works for the presets.
TEST(Qwen2, MemoryPlanPredictsTheMeasuredPeakExactly) {
  struct Case {
    std::int64_t mb, seq;
    std::string attn = "eager";
    bool fused = false, ckpt = false;
    std::string model_precision = "fp32", mixed = "no";
  };
  for (const Case& c : {Case{4, 64}, Case{4, 96, "flash", true}, Case{2, 64, "eager", false, true, "fp32", "bf16"},
                        Case{4, 64, "flash", true, true, "bf16"}}) {
    TrainOptions o;
    o.model = "qwen2-tiny";
    o.micro_batch_size = c.mb;
    o.seq_len = c.seq;
    o.attn = c.attn;
    o.fused_kernels = c.fused;
    o.activation_checkpointing = c.ckpt;
    o.model_precision = c.model_precision;
    o.mixed_precision = c.mixed;
    o.max_steps = 2;
    o.threads = 2;
    o.quiet = true;
    const TrainResult r = run_training(o);
    ASSERT_EQ(r.status, RunStatus::kOk) << r.error;
    EXPECT_EQ(r.config["model_family"], "qwen2");
    EXPECT_EQ(r.max_reserved_bytes, r.plan["total_bytes"].get<std::size_t>())
        << c.mb << "x" << c.seq << " " << c.attn << (c.fused ? " fused" : "") << (c.ckpt ? " ckpt" : "") << " "
        << c.model_precision << "/" << c.mixed;
  }
  TrainOptions big;
  big.model = "qwen2.5-0.5b";
  big.seq_len = 1024;
  big.micro_batch_size = 1;
  const MemoryPlan plan = plan_memory(make_plan_input(big));
  EXPECT_GT(plan.total, 4u * 494032768u);  // fp32 weights + gradients + two AdamW states, at least
}

}  // namespace
}  // namespace scalelab
