// `scalelab monitor`, run as a user runs it: with the fake NVML, and with no GPU at all.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>

#include "telemetry_test_support.h"

namespace scalelab {
namespace {

struct Run {
  std::string output;
  int status = -1;
};

Run run(const std::string& env, const std::string& args) {
  const std::string cmd = env + " " + SCALELAB_EXE + " monitor " + args + " 2>&1";
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  r.status = ::pclose(p);
  return r;
}

std::vector<std::string> data_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  return lines;
}

TEST(Monitor, LinesPerGpuLikeDmon) {
  test::TempDir dir;
  test::write_file(dir / "nvml.txt",
                   "device 0 GPU-aaaa Fake H100\n"
                   "device 1 GPU-bbbb Fake H100\n"
                   "power_mw 0 123400\n"
                   "temperature 0 45\n"
                   "gpu_util 0 98 97\n"
                   "mem_util 0 40\n"
                   "mem_clock 0 2619\n"
                   "sm_clock 0 1980\n"
                   "mem_used 0 12945719296\n"
                   "pcie_rx 0 10240\n"
                   "pcie_tx 0 20480\n"
                   "temperature 1 not_supported\n");
  const std::string env = "env -u CUDA_VISIBLE_DEVICES SCALELAB_NVML_LIBRARY=" +
                          std::string(FAKE_NVML_LIB) + " FAKE_NVML_SCRIPT=" + (dir / "nvml.txt");
  const auto r = run(env, "--count 2 --interval 20 --csv " + (dir / "m.csv"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("# cuda:0: Fake H100 (GPU-aaaa)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# gpu    pwr  gtemp     sm    mem   mclk   pclk      fb  rxpci  txpci"),
            std::string::npos)
      << r.output;
  const auto lines = data_lines(r.output);
  ASSERT_EQ(lines.size(), 4u) << r.output;  // 2 readings x 2 GPUs
  // fb in MiB (12945719296 B = 12346 MiB), PCIe in MB/s (KB/s / 1024).
  EXPECT_EQ(lines[0], "    0    123     45     98     40   2619   1980   12346     10     20");
  EXPECT_EQ(lines[2], "    0    123     45     97     40   2619   1980   12346     10     20");
  EXPECT_EQ(lines[1].substr(0, 19), "    1      0      -");  // no temperature on GPU 1
  const std::string csv = test::read_file(dir / "m.csv");
  EXPECT_EQ(csv.rfind("t_s,source,device,gpu_util_pct", 0), 0u) << csv;
  EXPECT_NE(csv.find(",nvml,cuda:1,"), std::string::npos);
}

TEST(Monitor, WithoutAGpuSaysSoOnceAndShowsTheHost) {
  const auto r = run("SCALELAB_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1", "--count 3 --interval 20");
  ASSERT_EQ(r.status, 0) << r.output;
  std::size_t pos = r.output.find("no GPU");
  ASSERT_NE(pos, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no GPU", pos + 1), std::string::npos) << r.output;  // once
  EXPECT_NE(r.output.find("cannot load /nonexistent/libnvidia-ml.so.1"), std::string::npos);
  EXPECT_NE(r.output.find("mem_used"), std::string::npos);
  const auto lines = data_lines(r.output);
  ASSERT_EQ(lines.size(), 3u) << r.output;
  // The later lines have a CPU figure (the first has no interval to measure over yet).
  std::istringstream second(lines[1]);
  double t = -1, cpu = -1;
  second >> t >> cpu;
  EXPECT_GE(cpu, 0.0);
  EXPECT_LE(cpu, 100.0);
}

TEST(Monitor, RejectsBadFlags) {
  EXPECT_EQ(WEXITSTATUS(run("", "--interval 0").status), 2);
  EXPECT_EQ(WEXITSTATUS(run("", "--count -1").status), 2);
}

}  // namespace
}  // namespace scalelab
