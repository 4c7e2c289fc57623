// The OPT model beyond the golden data: finite differences of the whole model (every parameter
// tensor, several architectures), the switches against each other gradient by gradient, dropout
// (deterministic for a seed, regenerated masks under checkpointing, 0 equals none, training differs
// from evaluation), the grad-ready hook's ranges, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/error.h"
#include "core/parallel.h"
#include "model/init.h"
#include "model/model.h"
#include "model/params.h"
#include "model_test_util.h"
#include "train/data.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

ModelConfig tiny_opt() {
  ModelConfig c = preset_config("opt-tiny");
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.max_position_embeddings = 16;
  c.word_embed_proj_dim = 16;
  c.initializer_range = 0.3;  // large enough that every path carries a visible gradient
  c.validate("tiny_opt");
  return c;
}

// A model over its own flat buffers, with a fixed batch whose targets include an ignored token
// and whose inputs include the padding token 1.
struct Harness {
  ModelConfig cfg;
  ParamLayout layout;
  DeviceAllocator& alloc = testing::host_alloc();
  ExecContext ctx{&alloc, nullptr};
  Tensor params, grads;
  std::unique_ptr<Model> model;
  Batch batch;

  explicit Harness(const ModelConfig& c, ModelOptions o = {}, std::uint64_t seed = 7)
      : cfg(c), layout(ParamLayout::build(c)) {
    params = Tensor::empty({layout.total_numel()}, DType::kF32, alloc);
    grads = Tensor::zeros({layout.total_numel()}, DType::kF32, alloc);
    init_params(params, layout, cfg, seed);
    // Biases and norm parameters start at 0 / 1; perturb them so their gradients matter.
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 0.2f);
    for (const ParamInfo& p : layout.params()) {
      if (!p.is_norm && !p.is_bias) continue;
      Tensor v = layout.view(params, p);
      for (std::int64_t i = 0; i < p.numel; ++i) v.f32()[i] += d(rng);
    }
    model = make_model(cfg, layout, params, grads, o);
    batch = make_batch(2, 6, alloc);
    const std::int32_t in[] = {5, 1, 9, 33, 2, 1, 17, 1, 1, 30, 4, 12};
    const std::int32_t tg[] = {1, 9, 33, 2, 1, 7, -100, 1, 30, 4, 12, 39};
    for (int i = 0; i < 12; ++i) {
      batch.inputs.data<std::int32_t>()[i] = in[i];
      batch.targets.data<std::int32_t>()[i] = tg[i];
    }
  }
  double train_step() {
    grads.zero_();
    return model->forward_backward(batch, 1.0f, ctx);
  }
  double eval() { return model->forward_loss(batch, ctx); }
};

// Central differences of the loss against the analytic gradient, for a few elements of every
// parameter tensor (the largest-gradient element and two spread ones).
void finite_difference_check(const ModelConfig& cfg, const std::string& what) {
  Harness h(cfg);
  h.train_step();
  const double eps = 2e-3;
  int checked = 0;
  for (const ParamInfo& p : h.layout.params()) {
    Tensor w = h.layout.view(h.params, p), g = h.layout.view(h.grads, p);
    // The padding row of embed_tokens is left out: by design (padding_idx) its lookup gradient is
    // not the derivative of the loss.
    const bool tokens = p.name == "model.decoder.embed_tokens.weight";
    auto skip = [&](std::int64_t i) { return tokens && i / p.shape[1] == 1; };
    std::int64_t top = skip(0) ? p.shape[1] * 2 : 0;
    for (std::int64_t i = 1; i < p.numel; ++i)
      if (!skip(i) && std::fabs(g.f32()[i]) > std::fabs(g.f32()[top])) top = i;
    for (std::int64_t i : {top, p.numel / 3, (2 * p.numel) / 3 + 1}) {
      if (i >= p.numel || skip(i)) continue;
      const float orig = w.f32()[i];
      w.f32()[i] = static_cast<float>(orig + eps);
      const double lp = h.eval();
      w.f32()[i] = static_cast<float>(orig - eps);
      const double lm = h.eval();
      w.f32()[i] = orig;
      const double num = (lp - lm) / (2 * eps), ana = g.f32()[i];
      EXPECT_NEAR(ana, num, 1e-3 + 2e-2 * std::fabs(num)) << what << ": " << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 3 * static_cast<int>(h.layout.params().size()) / 2) << what;
}

TEST(Opt, FiniteDifferencesPreLn) { finite_difference_check(tiny_opt(), "pre-LN"); }

TEST(Opt, FiniteDifferencesPostLnProjectionsGelu) {
  ModelConfig c = tiny_opt();
  c.do_layer_norm_before = false;
  c.word_embed_proj_dim = 12;
  c.activation_function = "gelu";
  finite_difference_check(c, "post-LN, project_in/out, gelu");
}

TEST(Opt, FiniteDifferencesNoAffineNoBiasUntied) {
  ModelConfig c = tiny_opt();
  c.layer_norm_elementwise_affine = false;
  c.enable_bias = false;
  c.tie_word_embeddings = false;
  finite_difference_check(c, "no affine, no bias, untied head");
}

TEST(Opt, PaddingRowGetsNoLookupGradient) {
  ModelConfig c = tiny_opt();
  c.tie_word_embeddings = false;  // so only the lookup writes embed_tokens' gradient
  Harness h(c);
  h.train_step();
  const Tensor g = h.layout.view(h.grads, "model.decoder.embed_tokens.weight");
  for (std::int64_t j = 0; j < c.hidden_size; ++j) EXPECT_EQ(g.f32()[1 * c.hidden_size + j], 0.0f);
  double row5 = 0;
  for (std::int64_t j = 0; j < c.hidden_size; ++j) row5 += std::fabs(g.f32()[5 * c.hidden_size + j]);
  EXPECT_GT(row5, 0.0);
  // Position rows 0 and 1 are never read (offset 2); rows 2..7 are (seq 6).
  const Tensor gp = h.layout.view(h.grads, "model.decoder.embed_positions.weight");
  for (std::int64_t j = 0; j < 2 * c.hidden_size; ++j) EXPECT_EQ(gp.f32()[j], 0.0f);
  double used = 0;
  for (std::int64_t j = 2 * c.hidden_size; j < 8 * c.hidden_size; ++j) used += std::fabs(gp.f32()[j]);
  EXPECT_GT(used, 0.0);
  for (std::int64_t j = 8 * c.hidden_size; j < gp.numel(); ++j) EXPECT_EQ(gp.f32()[j], 0.0f);
}

// Each switch computes the same function: every gradient against the plain fp32 eager model.
void expect_same_gradients(const ModelConfig& c, const ModelOptions& o, double tol, const std::string& what) {
  Harness base(c), other(c, o);
  const double l0 = base.train_step(), l1 = other.train_step();
  EXPECT_NEAR(l1, l0, 1e-5 * std::fabs(l0)) << what;
  double max_err = 0, max_ref = 0;
  for (std::int64_t i = 0; i < base.grads.numel(); ++i) {
    max_err = std::max(max_err, static_cast<double>(std::fabs(base.grads.f32()[i] - other.grads.f32()[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(base.grads.f32()[i])));
  }
  EXPECT_LE(max_err, tol * max_ref) << what;
}

TEST(Opt, SwitchesGiveTheSameGradients) {
  for (bool pre_ln : {true, false}) {
    ModelConfig c = tiny_opt();
    c.do_layer_norm_before = pre_ln;
    if (!pre_ln) c.word_embed_proj_dim = 12;
    const std::string arch = pre_ln ? "pre-LN" : "post-LN + projections";
    ModelOptions o;
    o.attention = AttentionImpl::kFlash;
    expect_same_gradients(c, o, 1e-5, arch + " flash");
    o = {};
    o.activation_checkpointing = true;
    expect_same_gradients(c, o, 0.0, arch + " checkpointing (bit-identical)");
    o = {};
    o.fused_kernels = true;
    expect_same_gradients(c, o, 1e-5, arch + " fused");
    o.attention = AttentionImpl::kFlash;
    o.activation_checkpointing = true;
    expect_same_gradients(c, o, 1e-5, arch + " fused + flash + checkpointing");
  }
}

TEST(Opt, DropoutIsDeterministicAndRegeneratedUnderCheckpointing) {
  for (bool pre_ln : {true, false}) {
    ModelConfig c = tiny_opt();
    c.do_layer_norm_before = pre_ln;
    ModelOptions o;
    o.dropout = 0.2;
    o.seed = 11;
    Harness a(c, o), b(c, o);
    const double la = a.train_step();
    EXPECT_EQ(la, b.train_step());
    // Training (dropout) differs from evaluation (none) on the same weights.
    EXPECT_GT(std::fabs(la - a.eval()), 1e-4);
    // The next micro-step draws new masks.
    a.model->set_step(1);
    EXPECT_NE(a.train_step(), la);
    // Checkpointing recomputes each layer with the same masks: the same loss and gradients, bit
    // for bit; so does the fused path up to its reordered sums.
    ModelOptions oc = o;
    oc.activation_checkpointing = true;
    Harness ck(c, oc);
    EXPECT_EQ(ck.train_step(), la);
    for (std::int64_t i = 0; i < b.grads.numel(); ++i) ASSERT_EQ(ck.grads.f32()[i], b.grads.f32()[i]) << i;
    ModelOptions of = oc;
    of.fused_kernels = true;
    Harness fu(c, of);
    EXPECT_NEAR(fu.train_step(), la, 1e-5 * la);
    // Another seed, other masks.
    ModelOptions o2 = o;
    o2.seed = 12;
    Harness d(c, o2);
    EXPECT_NE(d.train_step(), la);
  }
}

TEST(Opt, DropoutGradientsMatchFiniteDifferencesOfTheMaskedModel) {
  // With the masks fixed (same key), the training loss is a smooth function of the weights:
  // central differences of forward_backward's loss against its gradient.
  ModelConfig c = tiny_opt();
  ModelOptions o;
  o.dropout = 0.3;
  Harness h(c, o);
  h.train_step();
  Tensor g = Tensor::empty({h.grads.numel()}, DType::kF32, h.alloc);
  g.copy_from(h.grads);
  const double eps = 1e-2;
  for (const char* name : {"model.decoder.layers.0.fc2.weight", "model.decoder.layers.1.self_attn.out_proj.bias",
                           "model.decoder.layers.0.self_attn.q_proj.weight"}) {
    const ParamInfo& p = h.layout.at(name);
    Tensor w = h.layout.view(h.params, p), gv = h.layout.view(g, p);
    for (std::int64_t i : {std::int64_t{0}, p.numel / 2, p.numel - 1}) {
      const float orig = w.f32()[i];
      w.f32()[i] = static_cast<float>(orig + eps);
      const double lp = h.train_step();
      w.f32()[i] = static_cast<float>(orig - eps);
      const double lm = h.train_step();
      w.f32()[i] = orig;
      const double num = (lp - lm) / (2 * eps);
      EXPECT_NEAR(gv.f32()[i], num, 1e-3 + 2e-2 * std::fabs(num)) << name << "[" << i << "]";
    }
  }
}

TEST(Opt, GradReadyHookCoversTheBufferOnce) {
  for (bool proj : {false, true}) {
    ModelConfig c = tiny_opt();
    if (proj) {
      c.word_embed_proj_dim = 12;
      c.tie_word_embeddings = false;
    }
    Harness h(c);
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    h.model->set_grad_ready_hook([&](std::int64_t b, std::int64_t e) { ranges.emplace_back(b, e); });
    h.train_step();
    ASSERT_EQ(ranges.size(), static_cast<std::size_t>(c.num_hidden_layers) + 2);
    std::sort(ranges.begin(), ranges.end());
    std::int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      EXPECT_EQ(b, at);
      EXPECT_GT(e, b);
      at = e;
    }
    EXPECT_EQ(at, h.layout.total_numel());
  }
}

TrainOptions opt_run(const std::string& model) {
  TrainOptions o;
  o.model = model;
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.max_steps = 3;
  o.lr = 1e-3;
  o.threads = 2;
  o.quiet = true;
  return o;
}

TEST(Opt, TrainerDropoutFlagAndConfig) {
  // A copy of opt-tiny whose config.json asks for dropout 0.1.
  testing::ScratchDir dir;
  ModelConfig c = preset_config("opt-tiny");
  c.dropout = 0.1;
  {
    std::ofstream out(dir / "config.json");
    out << c.to_hf_json().dump(2);
  }
  const TrainResult none = run_training(opt_run("opt-tiny"));  // the preset has dropout 0.0
  TrainOptions o = opt_run(dir.str());
  const TrainResult cfg = run_training(o);
  o.dropout = 0.0;
  const TrainResult off = run_training(o);
  o.dropout = 0.1;
  const TrainResult flag = run_training(o);
  ASSERT_EQ(none.status, RunStatus::kOk);
  ASSERT_EQ(cfg.status, RunStatus::kOk) << cfg.error;
  EXPECT_EQ(cfg.config["dropout_resolved"], 0.1);
  EXPECT_EQ(off.config["dropout_resolved"], 0.0);
  for (std::size_t i = 0; i < none.steps.size(); ++i) {
    EXPECT_EQ(off.steps[i].loss, none.steps[i].loss) << "--dropout 0 equals no dropout, step " << i;
    EXPECT_EQ(flag.steps[i].loss, cfg.steps[i].loss) << "--dropout 0.1 equals the config's 0.1, step " << i;
    EXPECT_NE(cfg.steps[i].loss, none.steps[i].loss) << i;
  }
  // The plan counts the dropout-masked gradient buffer.
  EXPECT_GE(cfg.plan["total_bytes"].get<double>(), none.plan["total_bytes"].get<double>());
}

TEST(Opt, RefusesWhatCannotWork) {
  TrainOptions o = opt_run("opt-tiny");
  o.dropout = 1.0;
  EXPECT_THROW(run_training(o), InvalidInput);
  o = opt_run("llama-tiny");
  o.dropout = 0.1;
  try {
    run_training(o);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--dropout"), std::string::npos) << e.what();
  }
  // A gelu OPT has no fused MLP.
  testing::ScratchDir dir;
  ModelConfig c = preset_config("opt-tiny");
  c.activation_function = "gelu";
  {
    std::ofstream out(dir / "config.json");
    out << c.to_hf_json().dump(2);
  }
  o = opt_run(dir.str());
  EXPECT_EQ(run_training(o).status, RunStatus::kOk);
  o.fused_kernels = true;
  try {
    run_training(o);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--fused-kernels"), std::string::npos) << e.what();
  }
  // config.json features that are not implemented are refused, not ignored.
  auto j = preset_config("opt-tiny").to_hf_json();
  j["layerdrop"] = 0.1;
  EXPECT_THROW(config_from_hf_json(j, "layerdrop"), InvalidInput);
  j["layerdrop"] = 0.0;
  j["attention_dropout"] = 0.1;
  EXPECT_THROW(config_from_hf_json(j, "attention_dropout"), InvalidInput);
  j["attention_dropout"] = 0.0;
  j["activation_function"] = "silu";
  EXPECT_THROW(config_from_hf_json(j, "activation"), InvalidInput);
}

TEST(Opt, ConfigPadTokenAndFinalNormRoundTrip) {
  auto j = preset_config("opt-tiny").to_hf_json();
  EXPECT_EQ(j["pad_token_id"], 1);
  ModelConfig c = config_from_hf_json(j, "t");
  ASSERT_TRUE(c.pad_token_id.has_value());
  EXPECT_EQ(*c.pad_token_id, 1);
  j.erase("pad_token_id");
  EXPECT_EQ(*config_from_hf_json(j, "t").pad_token_id, 1);  // OPTConfig's default
  j["pad_token_id"] = nullptr;
  EXPECT_FALSE(config_from_hf_json(j, "t").pad_token_id.has_value());
  j["_remove_final_layer_norm"] = true;
  c = config_from_hf_json(j, "t");
  EXPECT_FALSE(c.has_final_layer_norm());
  EXPECT_EQ(ParamLayout::build(c).find("model.decoder.final_layer_norm.weight"), nullptr);
  EXPECT_EQ(c.to_hf_json()["_remove_final_layer_norm"], true);
}

}  // namespace
}  // namespace scalelab
