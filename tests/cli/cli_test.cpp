// End-to-end checks of the scalelab binary: exit codes, messages, run records.
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
using scalelab::cli_test::run;
using scalelab::cli_test::read_json;

const std::string kTiny = "train --model llama-tiny --seq-len 16 --micro-batch-size 2 --max-steps 3 --threads 1 ";

TEST(Cli, TrainSucceedsAndWritesTheRunRecord) {
  const std::string json = testing::TempDir() + "cli_ok.json";
  const CmdResult r = run(kTiny + "--json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Training throughput: "), std::string::npos);
  EXPECT_NE(r.output.find("tokens/s/device"), std::string::npos);
  EXPECT_NE(r.output.find("Max reserved memory: "), std::string::npos);
  EXPECT_NE(r.output.find("step 3/3 | loss"), std::string::npos);
  const auto j = read_json(json);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["losses"].size(), 3u);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
}

TEST(Cli, ProfilePrintsTheBreakdown) {
  const CmdResult r = run(kTiny + "--profile");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"Profile", "matmul", "attention", "backward", "optimizer", "data"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
}

TEST(Cli, InvalidInputExitsTwoNamingTheProblem) {
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {Case{"train --bogus-flag", "bogus-flag"}, Case{kTiny + "--seq-len 0", "--seq-len"},
                        Case{kTiny + "--micro-batch-size -2", "--micro-batch-size"},
                        Case{kTiny + "--seq-len 4096", "max_position_embeddings"},
                        Case{kTiny + "--data /nonexistent/tokens.bin", "/nonexistent/tokens.bin"},
                        Case{kTiny + "--model no-such-model", "unknown model preset"},
                        Case{kTiny + "--device-memory lots", "--device-memory"},
                        Case{kTiny + "--attn sparse", "--attn"}, Case{"", "subcommand"}}) {
    const CmdResult r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(Cli, ConfigMissingAFieldIsInvalidInput) {
  const std::string dir = testing::TempDir() + "cfg_missing";
  std::system(("mkdir -p " + dir).c_str());
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 256})";
  const CmdResult r = run("train --model " + dir + " --seq-len 8 --max-steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("intermediate_size"), std::string::npos) << r.output;
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 5, "vocab_size": 256})";
  const CmdResult r2 = run("train --model " + dir + " --seq-len 8 --max-steps 1");
  EXPECT_EQ(r2.code, 2) << r2.output;
  EXPECT_NE(r2.output.find("does not divide hidden_size"), std::string::npos) << r2.output;
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3, "vocab_size": 256})";
  const CmdResult r3 = run("train --model " + dir + " --seq-len 8 --max-steps 1");
  EXPECT_EQ(r3.code, 2) << r3.output;
  EXPECT_NE(r3.output.find("num_key_value_heads"), std::string::npos) << r3.output;
}

TEST(Cli, OutOfMemoryExitsThreeWithTheRecordAndPlan) {
  const std::string json = testing::TempDir() + "cli_oom.json";
  const CmdResult r = run(kTiny + "--device-memory 256KiB --json " + json);
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("out of"), std::string::npos);
  EXPECT_NE(r.output.find("largest micro-batch that fits"), std::string::npos) << r.output;
  const auto j = read_json(json);
  EXPECT_EQ(j["status"], "oom");
  EXPECT_GT(j["oom"]["requested_bytes"].get<std::size_t>(), 0u);
  EXPECT_EQ(j["oom"]["capacity_bytes"].get<std::size_t>(), 256u * 1024);
  EXPECT_TRUE(j["memory_plan"]["items"].is_array());
}

TEST(Cli, PlanPrintsTheBreakdownAndLargestBatch) {
  const std::string json = testing::TempDir() + "cli_plan.json";
  const CmdResult r = run("plan --model llama-small --seq-len 1024 --micro-batch-size 2 --device-memory 4GiB --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"weights", "gradients", "optimizer states", "activations", "attention scores", "total",
                        "largest micro-batch that fits"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
  const auto j = read_json(json);
  EXPECT_GT(j["max_micro_batch_size"].get<int>(), 0);
  EXPECT_GT(j["total_bytes"].get<double>(), 1e9);
}

}  // namespace

namespace {

// `train --telemetry` with the fake libnvidia-ml: the record carries the GPU's and the process's
// summaries and the CSV has one row per sample per source.
TEST(Cli, TrainTelemetrySummaryAndCsv) {
  const std::string dir = testing::TempDir();
  const std::string script = dir + "fake_nvml_script.txt";
  std::ofstream(script) << "device 0 GPU-11111111-2222-3333-4444-555555555555 Fake H100\n"
                           "power_mw 0 300000 310000 320000\n"
                           "energy_mj 0 1000 2000 3000 4000 5000\n"
                           "mem_total 0 85899345920\nmem_used 0 1073741824\ngpu_util 0 90\n";
  const std::string json = dir + "cli_tel.json", csv = dir + "cli_tel.csv";
  const std::string env = "SCALELAB_NVML_LIBRARY=" + std::string(FAKE_NVML_LIB) + " FAKE_NVML_SCRIPT=" + script +
                          " SCALELAB_NVIDIA_SMI=/nonexistent ";
  const std::string cmd = env + std::string(SCALELAB_EXE) + " " + kTiny +
                          "--telemetry --telemetry-interval 20 --telemetry-csv " + csv + " --json " + json + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  ASSERT_EQ(pclose(p), 0) << out;
  const auto j = read_json(json);
  ASSERT_TRUE(j.contains("telemetry")) << out;
  const auto& t = j["telemetry"];
  EXPECT_TRUE(t["devices"].contains("cuda:0")) << t.dump();
  EXPECT_GT(t["readings"].get<int>(), 1);
  EXPECT_TRUE(t["process"].contains("rss_bytes"));
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_NE(header.find("source"), std::string::npos);
  int rows = 0;
  for (std::string line; std::getline(in, line);) rows += line.find("nvml") != std::string::npos;
  EXPECT_GT(rows, 0);
}

}  // namespace
