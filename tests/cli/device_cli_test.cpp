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
