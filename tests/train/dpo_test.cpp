// DPO (train/dpo.h): the loss and its gradient against the formula, the [chosen; rejected] batch
// layout, the refusals of bad preference files, and finite differences of the whole step (policy
// through the network, reference frozen or the adapters off).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/loss.h"
#include "model/config.h"
#include "model/decoder/lora.h"
#include "model/init.h"
#include "model/model.h"
#include "model/params.h"
#include "train/data.h"
#include "train/dpo.h"

namespace scalelab {
namespace {

DeviceAllocator& host() {
  static DeviceAllocator alloc(make_host_backend(), std::size_t{4} << 30);
  return alloc;
}

double log_sigmoid(double x) { return -std::log1p(std::exp(-x)); }

TEST(DpoLoss, EqualsTheFormulaWithRewardsMarginAndAccuracy) {
  // Two pairs: policy (chosen, chosen, rejected, rejected) and reference sums.
  const std::vector<double> pi = {-10.0, -20.0, -12.0, -18.0}, ref = {-11.0, -19.0, -11.5, -19.5};
  const double beta = 0.2, eps = 0.1;
  std::vector<double> g;
  const DpoStats s = dpo_loss(pi, ref, beta, eps, 1.0, &g);
  double loss = 0, c = 0, r = 0, acc = 0;
  for (int i = 0; i < 2; ++i) {
    const double z = beta * ((pi[i] - pi[2 + i]) - (ref[i] - ref[2 + i]));
    loss += (-(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z)) / 2;
    c += beta * (pi[i] - ref[i]) / 2;
    r += beta * (pi[2 + i] - ref[2 + i]) / 2;
    acc += (beta * (pi[i] - ref[i]) > beta * (pi[2 + i] - ref[2 + i])) / 2.0;
  }
  EXPECT_NEAR(s.loss, loss, 1e-15);
  EXPECT_NEAR(s.rewards_chosen, c, 1e-15);
  EXPECT_NEAR(s.rewards_rejected, r, 1e-15);
  EXPECT_NEAR(s.margin, c - r, 1e-15);
  EXPECT_DOUBLE_EQ(s.accuracy, 0.5);  // pair 0: reward 0.2 vs -0.1; pair 1: -0.2 vs 0.3
  EXPECT_EQ(acc, 0.5);
  // The gradient against central differences of the loss itself (in double: h = 1e-6).
  for (std::size_t k = 0; k < pi.size(); ++k) {
    auto p = pi, m = pi;
    p[k] += 1e-6;
    m[k] -= 1e-6;
    const double num = (dpo_loss(p, ref, beta, eps, 1.0, nullptr).loss - dpo_loss(m, ref, beta, eps, 1.0, nullptr).loss) / 2e-6;
    EXPECT_NEAR(g[k], num, 1e-8) << k;
  }
  // grad_scale scales the gradient only.
  std::vector<double> g2;
  EXPECT_DOUBLE_EQ(dpo_loss(pi, ref, beta, eps, 0.25, &g2).loss, s.loss);
  for (std::size_t k = 0; k < g.size(); ++k) EXPECT_DOUBLE_EQ(g2[k], 0.25 * g[k]);
  // Equal policy and reference: log 2, zero rewards (the first step of LoRA, B = 0).
  EXPECT_NEAR(dpo_loss(ref, ref, beta, 0.0, 1.0, nullptr).loss, std::log(2.0), 1e-15);
}

TEST(DpoLoss, StatsAccumulateOverMicroBatchesByPairs) {
  DpoStats a, b, sum;
  a.loss = 1;
  a.accuracy = 1;
  a.pairs = 1;
  b.loss = 4;
  b.accuracy = 0;
  b.pairs = 3;
  sum.add(a);
  sum.add(b);
  EXPECT_DOUBLE_EQ(sum.loss, 13.0 / 4);
  EXPECT_DOUBLE_EQ(sum.accuracy, 0.25);
  EXPECT_EQ(sum.pairs, 4);
}

TEST(DpoData, ChosenRowsThenRejectedRowsWithPromptAndPaddingMasked) {
  PreferencePair p;
  p.prompt = {1, 2, 3};
  p.chosen = {4, 5};
  p.rejected = {6};
  Batch b = make_batch(4, 6, host());  // B = 2 pairs
  fill_pair_rows(p, 1, 2, 6, 0, b);
  const std::int32_t* in = b.inputs.data<std::int32_t>();
  const std::int32_t* tg = b.targets.data<std::int32_t>();
  const std::int32_t X = kernels::kIgnoreIndex;
  // Row 1: 1 2 3 4 5 -> inputs 1 2 3 4 pad pad, targets - - 4 5 - -.
  EXPECT_EQ(std::vector<std::int32_t>(in + 6, in + 12), (std::vector<std::int32_t>{1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(std::vector<std::int32_t>(tg + 6, tg + 12), (std::vector<std::int32_t>{X, X, 4, 5, X, X}));
  // Row B + 1 = 3: 1 2 3 6.
  EXPECT_EQ(std::vector<std::int32_t>(in + 18, in + 24), (std::vector<std::int32_t>{1, 2, 3, 0, 0, 0}));
  EXPECT_EQ(std::vector<std::int32_t>(tg + 18, tg + 24), (std::vector<std::int32_t>{X, X, 6, X, X, X}));
}

const std::string kTokenizer = std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/data/tokenizer/llama3_style/tokenizer.json";

std::string write_pairs(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "dpo_" + name + ".jsonl";
  std::ofstream(path) << text;
  return path;
}

void expect_refused(const std::string& text, std::int64_t seq, const std::string& want) {
  const std::string path = write_pairs("bad", text);
  try {
    read_preference_pairs(path, seq, 4096, TextSourceOptions{kTokenizer, "", "--pairs"});
    ADD_FAILURE() << "accepted: " << text;
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("[--pairs]"), std::string::npos) << m;
    EXPECT_NE(m.find(want), std::string::npos) << m << "\nwant: " << want;
  }
}

TEST(DpoData, RefusesBadPairsNamingTheLine) {
  const std::string ok = R"({"prompt": "Hi", "chosen": " there", "rejected": " no"})";
  expect_refused(ok + "\n" + R"({"prompt": "Hi", "chosen": " x"})" + "\n", 16, "line 2: the field \"rejected\" is missing");
  expect_refused(ok + "\n\n" + R"({"prompt": "Hi", "chosen": "", "rejected": " no"})", 16, "line 3: the chosen completion is empty");
  expect_refused(R"({"prompt": "a b c d e f g h i j k l m n o p", "chosen": " x", "rejected": " y"})", 8,
                 "tokens, longer than the sequence (--seq-len 8)");
  expect_refused("[1, 2]\n", 16, "line 1: not a JSON object");
  expect_refused("{oops\n", 16, "line 1: not valid JSON");
  expect_refused(R"({"prompt": 3, "chosen": " x", "rejected": " y"})", 16, "line 1: the field \"prompt\" is not a string");
  expect_refused("\n\n", 16, "has no preference pairs");
}

TEST(DpoData, TokenizesAsThePairsAreAndCutsLongCompletions) {
  const std::string path = write_pairs(
      "ok", R"({"prompt": "Hi", "chosen": " there", "rejected": " a very long answer that goes on and on and on"})");
  const PreferenceData d = read_preference_pairs(path, 8, 4096, TextSourceOptions{kTokenizer, "", "--pairs"});
  ASSERT_EQ(d.pairs.size(), 1u);
  const PreferencePair& p = d.pairs[0];
  EXPECT_EQ(p.line, 1);
  EXPECT_EQ(p.prompt.front(), 1500);  // <|begin_of_text|>: the template's BOS
  EXPECT_EQ(p.chosen.back(), 1501);   // <|end_of_text|> appended
  EXPECT_EQ(static_cast<std::int64_t>(p.prompt.size() + p.rejected.size()), 9);  // cut to seq_len + 1
  EXPECT_EQ(d.truncated, 1);
}

// ---- finite differences of the whole DPO step

ModelConfig tiny_llama() {
  ModelConfig c = resolve_model("llama-tiny");
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.vocab_size = 32;
  c.max_position_embeddings = 16;
  c.initializer_range = 0.3;
  c.tie_word_embeddings = false;
  c.validate("tiny_llama");
  return c;
}

// OPT with biases, learned positions, a tied head and project_in/out (word_embed_proj_dim 12 <
// hidden 16), pre-LN; untied head not needed (the Llama harness has one).
ModelConfig tiny_opt() {
  ModelConfig c = preset_config("opt-tiny");
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 32;
  c.max_position_embeddings = 16;
  c.word_embed_proj_dim = 12;
  c.initializer_range = 0.3;
  c.validate("tiny_opt");
  return c;
}

struct DpoHarness {
  ModelConfig cfg;
  ParamLayout layout;
  ExecContext ctx{&host(), nullptr};
  Tensor params, grads, ref_params;
  std::unique_ptr<Model> policy, reference;
  Batch batch;
  double beta = 1.0, eps = 0.1;

  explicit DpoHarness(bool lora, ModelConfig c = tiny_llama()) : cfg(std::move(c)) {
    LoraConfig l;
    if (lora) {
      l.rank = 2;
      l.alpha = 4;
      l.targets = cfg.family == ModelFamily::kOPT ? std::vector<std::string>{"q_proj", "out_proj", "fc2"}
                                                  : std::vector<std::string>{"q_proj", "v_proj", "down_proj"};
    }
    layout = ParamLayout::build(cfg, "", l);
    params = Tensor::empty({layout.total_numel()}, DType::kF32, host());
    grads = Tensor::zeros({layout.trainable_numel()}, DType::kF32, host());
    init_params(params, layout, cfg, 11);
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 0.3f);
    for (const ParamInfo& p : layout.params()) {
      // Norms and LoRA's B away from 1 / 0, so that the policy differs from the reference.
      if (!p.is_norm && p.name.find("lora_B") == std::string::npos) continue;
      Tensor v = layout.view(params, p);
      for (std::int64_t i = 0; i < p.numel; ++i) v.f32()[i] += d(rng);
    }
    policy = make_model(cfg, layout, params, grads, ModelOptions{});
    if (!lora) {
      // A reference that differs from the policy (another initialization).
      ref_params = Tensor::empty({layout.total_numel()}, DType::kF32, host());
      init_params(ref_params, layout, cfg, 12);
      reference = make_model(cfg, layout, ref_params, grads, ModelOptions{});
    }
    batch = make_batch(4, 6, host());  // 2 pairs
    const PreferencePair a{{3, 7}, {9, 12, 4}, {21, 5}, 1}, b{{8}, {30, 2, 2, 17, 6}, {11}, 2};
    fill_pair_rows(a, 0, 2, 6, 0, batch);
    fill_pair_rows(b, 1, 2, 6, 0, batch);
  }
  double step() {
    grads.zero_();
    return dpo_micro_step(*policy, reference.get(), batch, beta, eps, 1.0f, ctx).loss;
  }
  double eval() {
    Tensor lp = Tensor::empty({24}, DType::kF32, host());
    auto sums = [&](Model& m, ExecContext& c) {
      m.forward_logprobs(lp, batch, c);  // (under an AdaptersOff guard for the LoRA reference)
      std::vector<double> s(4, 0.0);
      for (int r = 0; r < 4; ++r)
        for (int t = 0; t < 6; ++t) s[static_cast<std::size_t>(r)] += lp.f32()[r * 6 + t];
      return s;
    };
    std::vector<double> ref;
    if (reference) {
      ref = sums(*reference, ctx);
    } else {
      AdaptersOff off;
      ref = sums(*policy, ctx);
    }
    const std::vector<double> pi = sums(*policy, ctx);
    return dpo_loss(pi, ref, beta, eps, 1.0, nullptr).loss;
  }
};

void finite_differences(bool lora, ModelConfig cfg = tiny_llama()) {
  DpoHarness h(lora, std::move(cfg));
  const double loss = h.step();
  EXPECT_NEAR(loss, h.eval(), 1e-6);
  EXPECT_GT(std::fabs(loss - std::log(2.0)), 1e-3) << "policy and reference should differ";
  const double e = 2e-3;
  int checked = 0;
  for (const ParamInfo& p : h.layout.params()) {
    if (!p.trainable) continue;
    Tensor w = h.layout.view(h.params, p), g = h.layout.grad_view(h.grads, p.name);
    std::int64_t top = 0;
    for (std::int64_t i = 1; i < p.numel; ++i)
      if (std::fabs(g.f32()[i]) > std::fabs(g.f32()[top])) top = i;
    for (std::int64_t i : {top, p.numel / 3, (2 * p.numel) / 3 + 1}) {
      if (i >= p.numel) continue;
      const float orig = w.f32()[i];
      w.f32()[i] = static_cast<float>(orig + e);
      const double lp = h.eval();
      w.f32()[i] = static_cast<float>(orig - e);
      const double lm = h.eval();
      w.f32()[i] = orig;
      const double num = (lp - lm) / (2 * e), ana = g.f32()[i];
      EXPECT_NEAR(ana, num, 1e-3 + 2e-2 * std::fabs(num)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(DpoGrad, FiniteDifferencesFullFineTuningWithAFrozenReference) { finite_differences(false); }
TEST(DpoGrad, FiniteDifferencesLoraWithTheAdaptersOffAsReference) { finite_differences(true); }
// OPT: biases, learned positions (the rows' positions restart at 0), LayerNorm, project_in/out.
TEST(DpoGrad, FiniteDifferencesOptFullFineTuning) { finite_differences(false, tiny_opt()); }
TEST(DpoGrad, FiniteDifferencesOptLora) { finite_differences(true, tiny_opt()); }

TEST(DpoGrad, AdaptersOffIsTheBaseModel) {
  // With the adapters off, the LoRA model's log-probabilities are the base model's exactly.
  DpoHarness lora(true);
  const ParamLayout base_layout = ParamLayout::build(lora.cfg);
  Tensor base = Tensor::empty({base_layout.total_numel()}, DType::kF32, host());
  for (const ParamInfo& p : base_layout.params()) base_layout.view(base, p).copy_from(lora.layout.view(lora.params, p.name));
  Tensor g = Tensor::zeros({base_layout.trainable_numel()}, DType::kF32, host());
  auto m = make_model(lora.cfg, base_layout, base, g, ModelOptions{});
  Tensor a = Tensor::empty({24}, DType::kF32, host()), b = Tensor::empty({24}, DType::kF32, host());
  m->forward_logprobs(a, lora.batch, lora.ctx);
  {
    AdaptersOff off;
    lora.policy->forward_logprobs(b, lora.batch, lora.ctx);
  }
  for (int i = 0; i < 24; ++i) EXPECT_EQ(a.f32()[i], b.f32()[i]) << i;
  lora.policy->forward_logprobs(b, lora.batch, lora.ctx);  // adapters on: different
  double diff = 0;
  for (int i = 0; i < 24; ++i) diff += std::fabs(a.f32()[i] - b.f32()[i]);
  EXPECT_GT(diff, 1e-3);
}

}  // namespace
}  // namespace scalelab
