// The engine against PyTorch/transformers golden data (tests/golden/make_golden.py made it):
// logits and loss of the first micro-batch, every parameter gradient of step 1, and the losses of
// six AdamW steps with warmup, linear decay, weight decay and clipping.
// Tolerances (fp32, the issue's): loss 1e-5 relative, gradients 1e-4 absolute, trajectory 1e-3
// relative; logits 1e-4 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/checkpoint.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model_test_util.h"
#include "train/data.h"
#include "golden_util.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> v(static_cast<std::size_t>(t->numel()));
  f.read(*t, v.data(), DType::kF32);
  return v;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LogitsLossAndStepOneGradients) {
  const std::string dir = golden_dir(GetParam());
  const auto expected = testing::read_json(dir + "/expected.json");
  const auto& tr = expected["training"];
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/expected.safetensors");
  const ModelConfig cfg = load_config_dir(dir);
  // A case with frozen parameters (training.freeze): their gradients do not exist, here or there.
  const ParamLayout layout = ParamLayout::build(cfg, tr.value("freeze", ""));
  // The model runs on SCALELAB_TEST_DEVICE (cpu by default): weights load on the host and are
  // copied up; batches likewise; logits and gradients come back for the comparisons.
  DeviceAllocator& alloc = testing::device_alloc();
  ExecContext ctx{&alloc, nullptr};
  Tensor host_params = Tensor::empty({layout.total_numel()}, DType::kF32, testing::host_alloc());
  load_weights(dir, cfg, layout, host_params);
  Tensor params = testing::on_test_device(host_params);
  Tensor grads = Tensor::zeros({layout.trainable_numel()}, DType::kF32, alloc);
  auto model = make_model(cfg, layout, params, grads, ModelOptions{});
  const std::int64_t mb = tr["micro_batch_size"], seq = tr["seq_len"], accum = tr["grad_accum_steps"];

  auto data = make_data_source({dir + "/tokens.bin", seq, mb, cfg.vocab_size, 0, 0, 1});
  Batch host_batch = make_batch(mb, seq, testing::host_alloc());
  Batch batch = make_batch(mb, seq, alloc);
  data->next(host_batch);
  testing::upload_batch(batch, host_batch);
  Tensor logits;
  const double loss = model->forward_loss(batch, ctx, &logits);
  const double want_loss = expected["first_microbatch_loss"];
  EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
  const auto want_logits = read_f32(ref, "logits");
  ASSERT_EQ(static_cast<std::size_t>(logits.numel()), want_logits.size());
  const std::vector<float> got_logits = testing::host_f32(logits);
  double max_logit_err = 0;
  for (std::size_t i = 0; i < want_logits.size(); ++i)
    max_logit_err = std::max(max_logit_err, static_cast<double>(std::fabs(got_logits[i] - want_logits[i])));
  EXPECT_LT(max_logit_err, 1e-4);

  // Step 1 gradients, summed over the micro-batches of the first step.
  data = make_data_source({dir + "/tokens.bin", seq, mb, cfg.vocab_size, 0, 0, 1});
  for (std::int64_t k = 0; k < accum; ++k) {
    data->next(host_batch);
    testing::upload_batch(batch, host_batch);
    model->forward_backward(batch, 1.0f / static_cast<float>(accum), ctx);
  }
  int checked = 0, trainable = 0;
  for (const ParamInfo& p : layout.params()) {
    if (!p.trainable) {
      EXPECT_EQ(ref.find("grad." + p.name), nullptr) << p.name << " is frozen here but has a reference gradient";
      continue;
    }
    ++trainable;
    const auto want = read_f32(ref, "grad." + p.name);
    ASSERT_EQ(static_cast<std::int64_t>(want.size()), p.numel) << p.name;
    const std::vector<float> g = testing::host_f32(layout.view(grads, p));
    double max_err = 0, max_ref = 0;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const auto k = static_cast<std::size_t>(i);
      max_err = std::max(max_err, static_cast<double>(std::fabs(g[k] - want[k])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(want[static_cast<std::size_t>(i)])));
    }
    EXPECT_LT(max_err, 1e-4) << p.name << " (largest gradient " << max_ref << ")";
    ++checked;
  }
  EXPECT_EQ(checked, trainable);
}

TEST_P(Golden, AdamWTrajectoryWithWarmupDecayAndClipping) {
  const std::string dir = golden_dir(GetParam());
  const auto expected = testing::read_json(dir + "/expected.json");
  TrainOptions o = golden_train_options(dir);
  o.threads = 1;
  o.device = testing::test_device_name();
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.status, RunStatus::kOk) << r.error;
  ASSERT_EQ(r.steps.size(), expected["losses"].size());
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const double want = expected["losses"][i], lr = expected["lrs"][i], norm = expected["grad_norms"][i];
    EXPECT_NEAR(r.steps[i].loss, want, 1e-3 * want) << "step " << i;
    EXPECT_NEAR(r.steps[i].lr, lr, 1e-12) << "step " << i;
    EXPECT_NEAR(r.steps[i].grad_norm, norm, 1e-3 * norm) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Llama, Golden, ::testing::Values("llama_gqa_tied_rope3", "llama_untied_accum2"));
// --freeze 'embed_tokens|layers\.0\.' against requires_grad=False on the same names: the frozen
// parameters get no gradient, no AdamW state and no share of the clipping norm.
INSTANTIATE_TEST_SUITE_P(LlamaFrozen, Golden, ::testing::Values("llama_untied_freeze"));
// OPT: opt-125m-like (pre-LN, no projections) and opt-350m-like (project_in/out, post-LN, no final
// LayerNorm) with gradient accumulation; embed_tokens' padding row (pad_token_id 1) gets no
// gradient from the lookup, as transformers' nn.Embedding(padding_idx=1).
INSTANTIATE_TEST_SUITE_P(OPT, Golden, ::testing::Values("opt_tiny", "opt_proj_postln_accum2"));
// Qwen2: the Llama decoder with q/k/v biases (drawn non-zero, so the forward depends on them and
// their gradients go through linear_backward's bias path), GQA, tied embeddings, pad_token_id 1
// (no lookup gradient for that row), gradient accumulation 2.
INSTANTIATE_TEST_SUITE_P(Qwen2, Golden, ::testing::Values("qwen2_gqa_tied_bias_accum2"));

}  // namespace
}  // namespace scalelab
