// The binary's device handling: `train --device`, `--allow-tf32` and `selftest`. Without a GPU
// (or in a build without CUDA) --device cuda must fail with exit 2 (the user can fix it) and the
// reason, never crash; with one, the same tests check that it runs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "core/device.h"
#include "model/config.h"

namespace {

using scalelab::cli_test::CmdResult;
using scalelab::cli_test::run;
using scalelab::cli_test::read_json;

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

const std::string kTiny = "train --model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 2 --threads 1 ";

TEST(DeviceCli, TrainOnCudaRunsOrExitsTwoWithTheReason) {
  const std::string json = testing::TempDir() + "cli_cuda.json";
  const CmdResult r = run(kTiny + "--device cuda --json " + json);
  std::string why;
  if (scalelab::device_available(scalelab::DeviceType::kCUDA, &why)) {
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(has(r.output, "device cuda: ")) << r.output;
    EXPECT_EQ(read_json(json)["status"], "ok");
    return;
  }
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "cuda is not available")) << r.output;
  EXPECT_TRUE(has(r.output, why)) << r.output;
  EXPECT_FALSE(has(r.output, "internal error")) << r.output;
  const auto j = read_json(json);  // the run record says why too
  EXPECT_EQ(j["status"], "error");
  EXPECT_TRUE(has(j["error"].get<std::string>(), "cuda")) << j.dump();
}

// Eager attention on CUDA runs on cuBLASLt by default (SCALELAB_CUDA_EAGER=fma: the first FMA-tile
// kernels), and the plan for --device cuda follows the switch: the cuBLASLt path's largest
// workspace is backward's fp32 dP plus dS in the activations' dtype, nkv·S·S each
// (kernels/attention.h, attention_eager_cuda_workspace_blocks); the FMA tiles take less. A value
// that names neither is refused with exit 2, naming the variable.
TEST(DeviceCli, CudaEagerAttentionIsPlannedOnCublasLtUnlessSetToFma) {
  const std::string json = testing::TempDir() + "cli_eager_plan.json";
  const std::int64_t seq = 128;
  auto workspace = [&](const char* eager) -> std::int64_t {
    if (eager) {
      setenv("SCALELAB_CUDA_EAGER", eager, 1);
    } else {
      unsetenv("SCALELAB_CUDA_EAGER");
    }
    const CmdResult r = run("plan --device cuda --model llama-tiny --attn eager --micro-batch-size 2 --seq-len " +
                            std::to_string(seq) + " --json " + json);
    unsetenv("SCALELAB_CUDA_EAGER");
    EXPECT_EQ(r.code, 0) << r.output;
    const nlohmann::json plan = read_json(json);  // kept: a loop over a temporary's member dangles
    for (const auto& item : plan["items"]) {
      if (item["name"] == "workspace") return item["bytes"].get<std::int64_t>();
    }
    ADD_FAILURE() << "no workspace line: " << r.output;
    return -1;
  };
  const std::int64_t nkv = scalelab::preset_config("llama-tiny").num_key_value_heads;
  const std::int64_t lt = nkv * seq * seq * (4 + 4);  // fp32 model: dP and dS both fp32
  EXPECT_EQ(workspace(nullptr), lt);
  EXPECT_EQ(workspace("cublaslt"), lt);
  EXPECT_LT(workspace("fma"), lt);
  setenv("SCALELAB_CUDA_EAGER", "tiles", 1);
  const CmdResult bad = run("plan --device cuda --model llama-tiny --attn eager");
  unsetenv("SCALELAB_CUDA_EAGER");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_TRUE(has(bad.output, "[SCALELAB_CUDA_EAGER] 'tiles' is not one of: cublaslt (the default), fma")) << bad.output;
}

TEST(DeviceCli, TrainRefusesMetaAndUnknownDevicesWithExitTwo) {
  CmdResult r = run(kTiny + "--device meta");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "meta")) << r.output;
  EXPECT_TRUE(has(r.output, "plan")) << r.output;
  r = run(kTiny + "--device tpu");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "--device")) << r.output;
}

TEST(DeviceCli, TrainNamesItsDeviceAndRecordsAllowTf32) {
  const std::string json = testing::TempDir() + "cli_tf32.json";
  CmdResult r = run(kTiny + "--device cpu --allow-tf32 --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "device cpu: host CPU")) << r.output;
  auto j = read_json(json);
  EXPECT_EQ(j["config"]["allow_tf32"], true);
  EXPECT_EQ(j["config"]["device"], "cpu");
  r = run(kTiny + "--json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_json(json)["config"]["allow_tf32"], false);
}

TEST(DeviceCli, SelftestOnTheCpuPrintsTheDeviceAndTheSummary) {
  const std::string json = testing::TempDir() + "selftest_cpu.json";
  const CmdResult r = run("selftest --device cpu --dtype fp32,bf16 --seed 3 --json " + json);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("Device: cpu", 0), 0u) << r.output;  // the first line
  EXPECT_TRUE(has(r.output, " passed, 0 failed\n")) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["seed"], 3);
  EXPECT_EQ(j["results"].size(), j["passed"].get<std::size_t>());
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["ok"], true) << row.dump();
    EXPECT_EQ(row["rel_error"], 0.0) << row.dump();  // the CPU against itself: bit for bit
    EXPECT_TRUE(row["dtype"] == "fp32" || row["dtype"] == "bf16") << row.dump();
  }
}

TEST(DeviceCli, SelftestFilterThatMatchesNothingRunsNothing) {
  const CmdResult r = run("selftest --device cpu --filter '^no-such-family/'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "0 passed, 0 failed")) << r.output;
}

TEST(DeviceCli, SelftestOnAnAbsentCudaExitsTwoWithTheReason) {
  std::string why;
  if (scalelab::device_available(scalelab::DeviceType::kCUDA, &why)) GTEST_SKIP() << "a CUDA device is present";
  const CmdResult r = run("selftest --device cuda");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "cuda is not available")) << r.output;
  EXPECT_TRUE(has(r.output, why)) << r.output;
  EXPECT_FALSE(has(r.output, "passed")) << r.output;
}

TEST(DeviceCli, SelftestBadFlagsExitTwo) {
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {Case{"selftest --device cpu --dtype int32", "--dtype"},
                        Case{"selftest --device cpu --dtype fp64", "--dtype"},
                        Case{"selftest --device cpu --filter '('", "--filter"},
                        Case{"selftest --device meta", "meta"}, Case{"selftest --device tpu", "--device"},
                        Case{"selftest --bogus", "bogus"}}) {
    const CmdResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(has(r.output, c.needle)) << c.args << "\n" << r.output;
  }
}

}  // namespace
