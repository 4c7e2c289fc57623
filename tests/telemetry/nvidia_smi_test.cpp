// The nvidia-smi source: line parsing, and the stream from a fake nvidia-smi script.
#include "telemetry/nvidia_smi.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include "telemetry/session.h"
#include "telemetry_test_support.h"

namespace scalelab {
namespace {

using test::values_of;
constexpr double kMiB = 1024.0 * 1024.0;

TEST(NvidiaSmiParse, QueryArgumentListsTheFields) {
  EXPECT_EQ(nvidia_smi_query_argument(),
            "--query-gpu=index,uuid,name,utilization.gpu,utilization.memory,memory.total,"
            "memory.used,temperature.gpu,power.draw,clocks.sm,clocks.mem");
}

TEST(NvidiaSmiParse, DataLine) {
  const auto row = parse_nvidia_smi_line(
      "0, GPU-5a1b, NVIDIA H100 80GB HBM3, 97, 41, 81559, 20480, 63, 612.35, 1980, 2619");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->index, 0u);
  EXPECT_EQ(row->uuid, "GPU-5a1b");
  EXPECT_EQ(row->name, "NVIDIA H100 80GB HBM3");
  const std::vector<std::pair<std::string, double>> expected = {
      {"gpu_util_pct", 97},      {"mem_util_pct", 41},   {"mem_total_bytes", 81559 * kMiB},
      {"mem_used_bytes", 20480 * kMiB}, {"temperature_c", 63}, {"power_w", 612.35},
      {"sm_clock_mhz", 1980},    {"mem_clock_mhz", 2619}};
  EXPECT_EQ(row->values, expected);
}

TEST(NvidiaSmiParse, PlaceholdersAreLeftOut) {
  const auto row = parse_nvidia_smi_line(
      "1, GPU-77, Tesla T4, [N/A], [Not Supported], 15360, 0, 35, [Unknown Error], N/A, 5000");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->index, 1u);
  const std::vector<std::pair<std::string, double>> expected = {
      {"mem_total_bytes", 15360 * kMiB}, {"mem_used_bytes", 0}, {"temperature_c", 35},
      {"mem_clock_mhz", 5000}};
  EXPECT_EQ(row->values, expected);
  EXPECT_TRUE(nvidia_smi_value_missing("[N/A]"));
  EXPECT_TRUE(nvidia_smi_value_missing(" [Not Supported] "));
  EXPECT_TRUE(nvidia_smi_value_missing("[GPU is lost]"));
  EXPECT_FALSE(nvidia_smi_value_missing("0"));
}

TEST(NvidiaSmiParse, OtherLinesAreRejected) {
  EXPECT_FALSE(parse_nvidia_smi_line(
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."));
  EXPECT_FALSE(parse_nvidia_smi_line("0, GPU-1, name, 1, 2, 3"));  // too few columns
  EXPECT_FALSE(parse_nvidia_smi_line("x, GPU-1, n, 1, 2, 3, 4, 5, 6, 7, 8"));
  EXPECT_FALSE(parse_nvidia_smi_line("0, GPU-1, n, 1, 2, 3, 4, 5, 6 W, 7, 8"));  // units: not ours
}

class FakeSmi : public ::testing::Test {
 protected:
  void data(const nlohmann::json& j) {
    test::write_file(dir_ / "smi.json", j.dump());
    ::setenv("FAKE_NVIDIA_SMI_DATA", (dir_ / "smi.json").c_str(), 1);
  }
  NvidiaSmiSource::Options options(const std::optional<std::string>& visible = std::nullopt) {
    NvidiaSmiSource::Options o;
    o.path = FAKE_NVIDIA_SMI;
    o.interval = std::chrono::milliseconds(10);
    o.cuda_visible_from_env = false;
    o.cuda_visible_devices = visible;
    return o;
  }
  test::TempDir dir_;
};

const nlohmann::json kTwoGpus = {{{"index", 0}, {"uuid", "GPU-aaaa"}, {"name", "Fake A"}},
                                 {{"index", 1}, {"uuid", "GPU-bbbb"}, {"name", "Fake B"}}};

TEST_F(FakeSmi, StreamsScriptedTicksUntilItEnds) {
  data({{"gpus", kTwoGpus},
        {"ticks", nlohmann::json::parse(R"([
           [{"utilization.gpu": "10", "memory.used": "1024", "power.draw": "100.5"},
            {"utilization.gpu": "50"}],
           [{"utilization.gpu": "20", "memory.used": "2048", "power.draw": "[N/A]"},
            {"utilization.gpu": "[Not Supported]"}],
           [{"utilization.gpu": "30", "memory.used": "3072", "power.draw": "300"},
            {"utilization.gpu": "70"}]])")}});
  TimeSeries ts;
  NvidiaSmiSource src(options());
  ASSERT_EQ(src.open(), "");
  src.begin(TelemetryClock::now(), ts);
  ASSERT_TRUE(test::wait_until([&] { return src.stream_ended(); }));
  src.close();
  const auto s = ts.samples();
  EXPECT_EQ(values_of(s, "nvidia-smi", "cuda:0", "gpu_util_pct"), (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(values_of(s, "nvidia-smi", "cuda:0", "mem_used_bytes"),
            (std::vector<double>{1024 * kMiB, 2048 * kMiB, 3072 * kMiB}));
  EXPECT_EQ(values_of(s, "nvidia-smi", "cuda:0", "power_w"), (std::vector<double>{100.5, 300}));
  EXPECT_EQ(values_of(s, "nvidia-smi", "cuda:1", "gpu_util_pct"), (std::vector<double>{50, 70}));
  EXPECT_TRUE(values_of(s, "nvidia-smi", "cuda:1", "temperature_c").empty());  // [N/A] throughout
  EXPECT_EQ(src.lines_parsed(), 6u);
  const auto notes = src.take_notes();
  EXPECT_TRUE(test::any_note_contains(notes, "nvidia-smi: stream ended"));
  EXPECT_TRUE(test::any_note_contains(notes, "exit status 0"));
}

TEST_F(FakeSmi, HonoursCudaVisibleDevices) {
  data({{"gpus", kTwoGpus},
        {"ticks", nlohmann::json::parse(R"([[{"utilization.gpu": "10"}, {"utilization.gpu": "90"}]])")}});
  TimeSeries ts;
  NvidiaSmiSource src(options("GPU-bbbb"));
  ASSERT_EQ(src.open(), "");
  src.begin(TelemetryClock::now(), ts);
  ASSERT_TRUE(test::wait_until([&] { return src.stream_ended(); }));
  src.close();
  const auto s = ts.samples();
  EXPECT_EQ(values_of(s, "nvidia-smi", "cuda:0", "gpu_util_pct"), (std::vector<double>{90}));
  EXPECT_TRUE(values_of(s, "nvidia-smi", "cuda:1", "gpu_util_pct").empty());
}

TEST_F(FakeSmi, CloseStopsARunningStream) {
  data({{"gpus", kTwoGpus},
        {"hold", true},
        {"ticks", nlohmann::json::parse(R"([[{"utilization.gpu": "10"}, {}]])")}});
  TimeSeries ts;
  NvidiaSmiSource src(options());
  ASSERT_EQ(src.open(), "");
  src.begin(TelemetryClock::now(), ts);
  ASSERT_TRUE(test::wait_until([&] { return src.lines_parsed() >= 6; }));
  EXPECT_FALSE(src.stream_ended());
  src.close();  // kills and reaps the looping child; joins the reader
  EXPECT_TRUE(src.stream_ended());
  EXPECT_FALSE(test::any_note_contains(src.take_notes(), "stream ended"));
  const std::size_t n = ts.size();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // five of its intervals
  EXPECT_EQ(ts.size(), n);  // nothing appends after close(): the reader and the child are gone
}

TEST_F(FakeSmi, DriverFailureIsUnavailableWithItsMessage) {
  data({{"gpus", kTwoGpus},
        {"fail", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."}});
  TimeSeries ts;
  NvidiaSmiSource src(options());
  const std::string why = src.open();
  EXPECT_NE(why.find("exit status 9"), std::string::npos) << why;
  EXPECT_NE(why.find("couldn't communicate with the NVIDIA driver"), std::string::npos) << why;
}

TEST_F(FakeSmi, MissingBinaryIsUnavailable) {
  auto o = options();
  o.path = "/nonexistent/nvidia-smi";
  TimeSeries ts;
  NvidiaSmiSource src(o);
  EXPECT_EQ(src.open(), "/nonexistent/nvidia-smi not found (or not executable)");
}

// NVML and nvidia-smi side by side in one session: the agreement row compares them.
TEST_F(FakeSmi, AgreesWithNvmlInASession) {
  data({{"gpus", nlohmann::json::array({kTwoGpus[0]})},
        {"hold", true},
        {"ticks", nlohmann::json::parse(R"([[{"memory.used": "1024", "power.draw": "250"}]])")}});
  test::write_file(dir_ / "nvml.txt",
                   "device 0 GPU-aaaa Fake A\nmem_used 0 1000000000\npower_mw 0 248000\n");
  ::setenv("FAKE_NVML_SCRIPT", (dir_ / "nvml.txt").c_str(), 1);
  TelemetryOptions o;
  o.interval = std::chrono::milliseconds(20);
  o.nvml_library = FAKE_NVML_LIB;
  o.nvidia_smi_path = FAKE_NVIDIA_SMI;
  o.cuda_visible_from_env = false;
  o.host = false;
  o.report_unavailable = false;
  TelemetrySession s(o);
  s.start();
  ASSERT_TRUE(test::wait_until([&] {
    return values_of(s.samples(), "nvidia-smi", "cuda:0", "power_w").size() >= 5 &&
           s.readings() >= 5;
  }));
  s.stop();
  // The nvidia-smi child is telemetry's own cost: it is not part of this process's tree.
  for (double n : values_of(s.samples(), "process", "process", "num_processes")) EXPECT_EQ(n, 1);
  const auto j = s.summary();
  EXPECT_EQ(j["sources"]["nvidia-smi"], "ok");
  EXPECT_GT(j["sampling"]["nvidia_smi_cpu_s"].get<double>(), 0.0);
  bool found_mem = false, found_power = false;
  for (const auto& row : j["agreement"]) {
    if (row["a"]["source"] != "nvml" || row["b"]["source"] != "nvidia-smi") continue;
    EXPECT_EQ(row["device"], "cuda:0");
    EXPECT_GT(row["n"].get<int>(), 0);
    EXPECT_TRUE(row["pearson_r"].is_null());  // both constant here
    if (row["quantity"] == "mem_used_bytes") {
      found_mem = true;
      EXPECT_DOUBLE_EQ(row["mean_diff"].get<double>(), 1024 * kMiB - 1e9);
    }
    if (row["quantity"] == "power_w") {
      found_power = true;
      EXPECT_NEAR(row["mean_diff"].get<double>(), 2.0, 1e-9);
    }
  }
  EXPECT_TRUE(found_mem);
  EXPECT_TRUE(found_power);
}

}  // namespace
}  // namespace scalelab
