// End-to-end: `scalelab train` and `scalelab plan` on OPT presets, the --dropout flag, and the
// combinations that are refused with exit code 2.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"

namespace {

using scalelab::cli_test::CmdResult;
const auto& run_cli = scalelab::cli_test::run;

const std::string kOptTiny = "train --model opt-tiny --seq-len 32 --micro-batch-size 2 --max-steps 3 --threads 1 ";

TEST(OptCli, TrainRunsEverySwitchTogether) {
  const std::string json = testing::TempDir() + "opt_cli.json";
  const CmdResult r = run_cli(kOptTiny +
                              "--mixed-precision bf16 --attn flash --fused-kernels --activation-checkpointing "
                              "--dropout 0.1 --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(opt,"), std::string::npos) << r.output;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["losses"].size(), 3u);
  EXPECT_EQ(j["config"]["model_family"], "opt");
  EXPECT_EQ(j["config"]["dropout"], 0.1);
  EXPECT_EQ(j["config"]["dropout_resolved"], 0.1);
  EXPECT_EQ(j["max_reserved_bytes"].get<double>(), j["memory_plan"]["total_bytes"].get<double>());
}

TEST(OptCli, PlanOptSmall) {
  const CmdResult r = run_cli("plan --model opt-small --seq-len 1024 --micro-batch-size 2 --device-memory 8GiB");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"opt-small", "weights", "activations", "attention scores", "allocator cache", "total",
                        "largest micro-batch that fits"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  // Fused kernels keep the bias+ReLU output only and rebuild the LayerNorm outputs in backward:
  // the plan's activation line (from the allocations' labels) shows both changes.
  const std::string base = "plan --model opt-350m --seq-len 1024 --micro-batch-size 2 --attn flash";
  const CmdResult u = run_cli(base);
  const CmdResult f = run_cli(base + " --fused-kernels");
  ASSERT_EQ(u.code, 0) << u.output;
  ASSERT_EQ(f.code, 0) << f.output;
  auto activations = [](const std::string& out) {
    const auto at = out.find("  activations");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  const std::string ua = activations(u.output), fa = activations(f.output);
  for (const char* kept_unfused : {"layernorm output", "mlp fc1 output", "mlp activation"})
    EXPECT_NE(ua.find(kept_unfused), std::string::npos) << kept_unfused << "\n" << ua;
  EXPECT_EQ(fa.find("layernorm output"), std::string::npos) << fa;
  EXPECT_EQ(fa.find("mlp fc1 output"), std::string::npos) << fa;
  EXPECT_NE(fa.find("mlp activation"), std::string::npos) << fa;
}

TEST(OptCli, RefusedCombinationsExitTwo) {
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {Case{kOptTiny + "--dropout 1.5", "--dropout"}, Case{kOptTiny + "--dropout -0.1", "--dropout"},
                        Case{"train --model llama-tiny --seq-len 16 --max-steps 1 --dropout 0.1", "--dropout"}}) {
    const CmdResult r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
