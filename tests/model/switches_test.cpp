// Every engine switch computes the same function as the fp32 eager baseline: alone and in the
// ladder's combinations, the loss of the golden batch (step 0, before any update) matches the
// PyTorch fp32 loss within the switch's tolerance, and the next steps stay close.
// Tolerances (relative): fp32 switches 1e-5 (flash, checkpointing, fused kernels reorder sums
// only); fp16 storage 3e-3 (10-bit mantissa); bf16 storage 1.5e-2 (7-bit mantissa).
#include <gtest/gtest.h>

#include <string>

#include "golden_util.h"
#include "model_test_util.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

struct Switches {
  std::string name;
  std::string model_precision = "fp32", mixed = "no", attn = "eager";
  bool fused = false, ckpt = false;
  double tol = 1e-5;
};

void check_case(const std::string& golden, const Switches& sw) {
  const std::string dir = golden_dir(golden);
  const auto expected = testing::read_json(dir + "/expected.json");
  TrainOptions o = golden_train_options(dir);
  o.threads = 2;
  o.device = testing::test_device_name();  // SCALELAB_TEST_DEVICE (cpu by default)
  o.model_precision = sw.model_precision;
  o.mixed_precision = sw.mixed;
  o.attn = sw.attn;
  o.fused_kernels = sw.fused;
  o.activation_checkpointing = sw.ckpt;
  const TrainResult r = run_training(o);
  ASSERT_EQ(r.status, RunStatus::kOk) << sw.name << ": " << r.error;
  const double want0 = expected["losses"][0];
  EXPECT_NEAR(r.steps[0].loss, want0, sw.tol * want0) << sw.name << " on " << golden << " (golden batch)";
  // Later steps follow the fp32 trajectory; updates amplify storage rounding, so allow 3x.
  for (std::size_t i = 1; i < r.steps.size(); ++i) {
    const double want = expected["losses"][i];
    EXPECT_NEAR(r.steps[i].loss, want, std::max(1e-3, 3 * sw.tol) * want) << sw.name << " step " << i;
  }
}

const std::vector<Switches>& llama_switches() {
  static const std::vector<Switches> s = {
      {"flash", "fp32", "no", "flash"},
      {"activation checkpointing", "fp32", "no", "eager", false, true},
      {"mixed bf16", "fp32", "bf16", "eager", false, false, 1.5e-2},
      {"mixed fp16", "fp32", "fp16", "eager", false, false, 3e-3},
      {"bf16 weights", "bf16", "no", "eager", false, false, 1.5e-2},
      // The ladder's combinations.
      {"fused kernels", "fp32", "no", "eager", true},
      {"bf16 + flash", "bf16", "no", "flash", false, false, 1.5e-2},
      {"bf16 + flash + fused (the ladder's last rung)", "bf16", "no", "flash", true, false, 1.5e-2},
      {"mixed fp16 + fused", "fp32", "fp16", "eager", true, false, 3e-3},
      {"mixed bf16 + flash + checkpointing", "fp32", "bf16", "flash", false, true, 1.5e-2},
  };
  return s;
}

TEST(Switches, LlamaEverySwitchMatchesTheFp32Baseline) {
  for (const auto& golden : {"llama_gqa_tied_rope3", "llama_untied_accum2"})
    for (const Switches& sw : llama_switches()) check_case(golden, sw);
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// OPT: every switch, alone and in the ladder's combinations, including --fused-kernels (LayerNorm
// fused with the residual add and recomputed, bias+ReLU in place, chunked linear+cross-entropy),
// on the pre-LN golden model and on the post-LN one with project_in/out.
const std::vector<Switches>& opt_switches() {
  static const std::vector<Switches> s = {
      {"flash", "fp32", "no", "flash"},
      {"activation checkpointing", "fp32", "no", "eager", false, true},
      {"fused kernels", "fp32", "no", "eager", true},
      {"mixed bf16", "fp32", "bf16", "eager", false, false, 1.5e-2},
      {"mixed fp16", "fp32", "fp16", "eager", false, false, 3e-3},
      {"bf16 weights", "bf16", "no", "eager", false, false, 1.5e-2},
      // The ladder's combinations.
      {"bf16 + flash", "bf16", "no", "flash", false, false, 1.5e-2},
      {"bf16 + flash + fused", "bf16", "no", "flash", true, false, 1.5e-2},
      {"mixed bf16 + flash + fused + checkpointing", "fp32", "bf16", "flash", true, true, 1.5e-2},
      {"flash + fused + checkpointing", "fp32", "no", "flash", true, true},
  };
  return s;
}

TEST(Switches, OptEverySwitchMatchesTheFp32Baseline) {
  for (const auto& golden : {"opt_tiny", "opt_proj_postln_accum2"})
    for (const Switches& sw : opt_switches()) check_case(golden, sw);
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// Qwen2 runs the Llama decoder: Llama's switches, on the golden model with q/k/v biases.
TEST(Switches, Qwen2EverySwitchMatchesTheFp32Baseline) {
  for (const Switches& sw : llama_switches()) check_case("qwen2_gqa_tied_bias_accum2", sw);
}

}  // namespace
}  // namespace scalelab
