// train --lora-dropout P end to end: it trains, its measured peak equals the plan (the dropped
// input and the masked gradient are transients the plan measures; no mask is kept), P > 0 changes
// the trajectory while P = 0 reproduces the run without the flag bit for bit, and the saved
// adapter_config.json records it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli/cli_run.h"

namespace scalelab {
namespace {

using cli_test::read_json;
using cli_test::run;

const std::string kBase =
    "train --model llama-tiny --seq-len 32 --micro-batch-size 2 --max-steps 3 --threads 1 --quiet --lr 1e-2 "
    "--lora-rank 4 --lora-targets q_proj,v_proj,down_proj ";

TEST(LoraDropoutCli, TrainsAndTheMeasuredPeakEqualsThePlan) {
  const std::string json = testing::TempDir() + "lora_dropout_peak.json";
  for (const std::string sw : {"", " --activation-checkpointing --attn flash"}) {
    const auto r = run(kBase + "--lora-dropout 0.1 --json " + json + sw);
    ASSERT_EQ(r.code, 0) << r.output;
    const auto rec = read_json(json);
    EXPECT_EQ(rec["max_reserved_bytes"], rec["memory_plan"]["total_bytes"]) << sw;
    EXPECT_DOUBLE_EQ(rec["config"]["lora_dropout"].get<double>(), 0.1);
  }
}

TEST(LoraDropoutCli, ZeroIsBitIdenticalAndPositiveChangesTheTrajectory) {
  const std::string j0 = testing::TempDir() + "lora_dropout_none.json", j1 = testing::TempDir() + "lora_dropout_0.json",
                    j2 = testing::TempDir() + "lora_dropout_02.json";
  ASSERT_EQ(run(kBase + "--json " + j0).code, 0);
  ASSERT_EQ(run(kBase + "--lora-dropout 0 --json " + j1).code, 0);
  const std::string out = testing::TempDir() + "lora_dropout_adapter";
  std::filesystem::remove_all(out);
  const auto r = run(kBase + "--lora-dropout 0.2 --save " + out + " --json " + j2);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto l0 = read_json(j0)["losses"], l1 = read_json(j1)["losses"], l2 = read_json(j2)["losses"];
  EXPECT_EQ(l0, l1);  // P = 0: the same doubles
  // step 1 is the base model's loss either way (B = 0); the updates then differ
  EXPECT_EQ(l2[0], l0[0]);
  EXPECT_NE(l2[2], l0[2]);
  const auto cfg = read_json(out + "/adapter_config.json");
  EXPECT_DOUBLE_EQ(cfg["lora_dropout"].get<double>(), 0.2);
}

TEST(LoraDropoutCli, OutOfRangeExitsTwo) {
  const auto r = run(kBase + "--lora-dropout 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--lora-dropout"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace scalelab
