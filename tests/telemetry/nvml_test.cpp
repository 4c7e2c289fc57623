// The NVML source through the real dlopen path, against the fake libnvidia-ml (fake_nvml.c).
#include "telemetry/nvml.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>

#include "telemetry/session.h"
#include "telemetry_test_support.h"

namespace scalelab {
namespace {

using test::any_note_contains;
using test::count_notes_containing;
using test::values_of;

TelemetryOptions nvml_only(const std::string& library) {
  TelemetryOptions o;
  o.nvml_library = library;
  o.nvidia_smi = false;
  o.host = false;
  o.process = true;  // its pids feed process_mem_used_bytes
  o.cuda_visible_from_env = false;
  o.report_unavailable = false;
  return o;
}

class FakeNvml : public ::testing::Test {
 protected:
  void script(const std::string& text) {
    test::write_file(dir_ / "nvml.txt", text);
    ::setenv("FAKE_NVML_SCRIPT", (dir_ / "nvml.txt").c_str(), 1);
  }
  test::TempDir dir_;
};

constexpr double kMiB = 1024.0 * 1024.0;

TEST_F(FakeNvml, ScriptedValuesTheirAveragesEnergyAndProcesses) {
  const std::string me = std::to_string(::getpid());
  script("device 0 GPU-aaaaaaaa-0000-0000-0000-000000000000 Fake H100 80GB HBM3\n"
         "device 1 GPU-bbbbbbbb-0000-0000-0000-000000000000 Fake H100 80GB HBM3\n"
         "gpu_util 0 10 20 30 40\n"
         "mem_util 0 5 5 15 15\n"
         "mem_total 0 85899345920\n"
         "mem_used 0 1073741824 2147483648 3221225472 4294967296\n"
         "mem_reserved 0 536870912\n"
         "temperature 0 40 42 44 46\n"
         "power_mw 0 100000 200000 300000 400000\n"
         "energy_mj 0 1000 2000 4000 7000\n"
         "sm_clock 0 1980\n"
         "mem_clock 0 2619\n"
         "pcie_tx 0 1024 2048\n"
         "pcie_rx 0 4096\n"
         "clocks_event 0 0 4 1 64\n"
         "procs 0 " + me + ":1000000 999999:5\n"
         "gpu_util 1 90\n");
  TelemetrySession s(nvml_only(FAKE_NVML_LIB));
  for (int i = 0; i < 4; ++i) s.sample_now();
  s.stop();
  ASSERT_EQ(s.source_status().at("nvml"), "ok");

  const auto gpus = s.gpus();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].device, "cuda:0");
  EXPECT_EQ(gpus[0].name, "Fake H100 80GB HBM3");
  EXPECT_EQ(gpus[0].uuid, "GPU-aaaaaaaa-0000-0000-0000-000000000000");
  EXPECT_EQ(gpus[1].nvml_index, 1u);

  const auto samples = s.samples();
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "gpu_util_pct"), (std::vector<double>{10, 20, 30, 40}));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "power_w"), (std::vector<double>{100, 200, 300, 400}));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "energy_j"), (std::vector<double>{1, 2, 4, 7}));
  // v2 memory: used excludes the reserved part, which is its own series.
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "mem_used_bytes"),
            (std::vector<double>{1024 * kMiB, 2048 * kMiB, 3072 * kMiB, 4096 * kMiB}));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "mem_reserved_bytes"),
            (std::vector<double>(4, 512 * kMiB)));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "pcie_tx_kb_s"), (std::vector<double>{1024, 2048, 2048, 2048}));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "num_processes"), (std::vector<double>(4, 2)));
  // Only this process's GPU memory counts for the followed tree.
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "process_mem_used_bytes"),
            (std::vector<double>(4, 1000000)));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:1", "gpu_util_pct"), (std::vector<double>(4, 90)));

  const auto j = s.summary(3.0);
  const auto& m = j["devices"]["cuda:0"]["metrics"]["nvml"];
  EXPECT_DOUBLE_EQ(m["gpu_util_pct"]["avg"].get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(m["gpu_util_pct"]["max"].get<double>(), 40.0);
  EXPECT_DOUBLE_EQ(m["mem_util_pct"]["avg"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(m["temperature_c"]["avg"].get<double>(), 43.0);
  EXPECT_DOUBLE_EQ(m["power_w"]["avg"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(m["mem_used_bytes"]["max"].get<double>(), 4096 * kMiB);
  EXPECT_EQ(m["gpu_util_pct"]["n"].get<int>(), 4);
  // Energy from the counter: 7 J - 1 J over the span, J per token over 3 tokens.
  EXPECT_DOUBLE_EQ(m["energy_j"]["delta"].get<double>(), 6.0);
  const auto& d0 = j["devices"]["cuda:0"];
  EXPECT_DOUBLE_EQ(d0["energy_j"].get<double>(), 6.0);
  EXPECT_EQ(d0["energy_method"], "nvml energy counter");
  EXPECT_DOUBLE_EQ(d0["j_per_token"].get<double>(), 2.0);
  EXPECT_EQ(d0["name"], "Fake H100 80GB HBM3");
  // Clock events 0, sw_power_cap, gpu_idle, hw_thermal_slowdown: 2 of 4 readings throttled.
  EXPECT_DOUBLE_EQ(m["clocks_event_reasons"]["throttled_fraction"].get<double>(), 0.5);
  EXPECT_EQ(m["clocks_event_reasons"]["any_mask"].get<unsigned long long>(), 0x45u);
  EXPECT_EQ(m["clocks_event_reasons"]["reasons"],
            (nlohmann::json{"gpu_idle", "sw_power_cap", "hw_thermal_slowdown"}));
  // The run's total: GPU 0's counter plus GPU 1's (no energy or power scripted: 0 mJ counter).
  EXPECT_EQ(j["energy_scope"], "gpu");
  EXPECT_DOUBLE_EQ(j["energy_j"].get<double>(), 6.0);
}

TEST_F(FakeNvml, NotSupportedFieldIsEmptyAndTheRestCarriesOn) {
  script("device 0 GPU-aaaa Fake A\n"
         "device 1 GPU-bbbb Fake B\n"
         "temperature 0 50\n"
         "temperature 1 not_supported\n"
         "power_mw 1 error 4\n"  // NO_PERMISSION: also off for the session
         "gpu_util 1 70\n");
  TelemetrySession s(nvml_only(FAKE_NVML_LIB));
  for (int i = 0; i < 3; ++i) s.sample_now();
  s.stop();
  const auto samples = s.samples();
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "temperature_c"), (std::vector<double>(3, 50)));
  EXPECT_TRUE(values_of(samples, "nvml", "cuda:1", "temperature_c").empty());
  EXPECT_TRUE(values_of(samples, "nvml", "cuda:1", "power_w").empty());
  EXPECT_EQ(values_of(samples, "nvml", "cuda:1", "gpu_util_pct"), (std::vector<double>(3, 70)));
  const auto j = s.summary();
  const auto& un = j["devices"]["cuda:1"]["nvml_unavailable_fields"];
  ASSERT_TRUE(un.contains("temperature_c"));
  EXPECT_NE(un["temperature_c"].get<std::string>().find("Not Supported"), std::string::npos);
  EXPECT_TRUE(un.contains("power_w"));
  EXPECT_FALSE(j["devices"]["cuda:0"].contains("nvml_unavailable_fields"));
}

TEST_F(FakeNvml, MissingSymbolsFallBackToV1AndIntegratedPower) {
  script("device 0 GPU-aaaa Fake A\n"
         "mem_total 0 1000000\n"
         "mem_used 0 300000\n"
         "mem_reserved 0 1000\n"
         "power_mw 0 100000 300000\n"
         "energy_mj 0 5 10 15\n"  // would be read if the symbol existed
         "clocks_event 0 4\n"
         "procs 0 " + std::to_string(::getpid()) + ":77\n");
  TelemetrySession s(nvml_only(FAKE_NVML_MINIMAL_LIB));
  for (int i = 0; i < 3; ++i) s.sample_now();
  s.stop();
  ASSERT_EQ(s.source_status().at("nvml"), "ok");
  const auto samples = s.samples();
  // v1 memory (no _v2 symbol): used includes the reserved part; no reserved series.
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "mem_used_bytes"), (std::vector<double>(3, 301000)));
  EXPECT_TRUE(values_of(samples, "nvml", "cuda:0", "mem_reserved_bytes").empty());
  EXPECT_TRUE(values_of(samples, "nvml", "cuda:0", "energy_j").empty());
  // Clock events through the pre-12.2 name, processes through the v1 entry point.
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "clocks_event_reasons"), (std::vector<double>(3, 4)));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "process_mem_used_bytes"), (std::vector<double>(3, 77)));

  const auto j = s.summary(10.0);
  const auto& d = j["devices"]["cuda:0"];
  EXPECT_EQ(d["energy_method"], "nvml integrated power");
  // Power 100, 300, 300 W at the readings' times: the trapezoid over them.
  const auto t = [&] {
    std::vector<double> ts;
    for (const auto& x : samples)
      if (x.source == "nvml" && x.metric == "power_w") ts.push_back(x.t_s);
    return ts;
  }();
  ASSERT_EQ(t.size(), 3u);
  const double expected = 0.5 * (100 + 300) * (t[1] - t[0]) + 300 * (t[2] - t[1]);
  EXPECT_NEAR(d["energy_j"].get<double>(), expected, 1e-9);
  EXPECT_NEAR(d["j_per_token"].get<double>(), expected / 10.0, 1e-9);
  EXPECT_EQ(j["devices"]["cuda:0"]["nvml_unavailable_fields"]["energy_j"],
            "missing symbol nvmlDeviceGetTotalEnergyConsumption");
}

TEST_F(FakeNvml, V2VersionMismatchFallsBackToV1Once) {
  script("device 0 GPU-aaaa Fake A\n"
         "mem_v2 mismatch\n"
         "mem_total 0 1000000\n"
         "mem_used 0 300000 400000\n"
         "mem_reserved 0 1000\n");
  TelemetrySession s(nvml_only(FAKE_NVML_LIB));
  for (int i = 0; i < 3; ++i) s.sample_now();
  s.stop();
  const auto samples = s.samples();
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "mem_used_bytes"),
            (std::vector<double>{301000, 401000, 401000}));
  EXPECT_TRUE(values_of(samples, "nvml", "cuda:0", "mem_reserved_bytes").empty());
  EXPECT_EQ(count_notes_containing(s.notes(), "nvmlDeviceGetMemoryInfo_v2 answered"), 1);
  EXPECT_TRUE(any_note_contains(s.notes(), "Argument version mismatch"));
}

TEST_F(FakeNvml, DeviceLostMidRunIsDroppedWithOneNote) {
  script("device 0 GPU-aaaa Fake A\n"
         "device 1 GPU-bbbb Fake B\n"
         "gpu_util 0 10\n"
         "gpu_util 1 20\n"
         "lost 1 2\n");
  TelemetrySession s(nvml_only(FAKE_NVML_LIB));
  for (int i = 0; i < 5; ++i) s.sample_now();
  s.stop();
  const auto samples = s.samples();
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "gpu_util_pct").size(), 5u);
  EXPECT_EQ(values_of(samples, "nvml", "cuda:1", "gpu_util_pct"), (std::vector<double>{20, 20}));
  EXPECT_EQ(count_notes_containing(s.notes(), "lost"), 1);
  EXPECT_TRUE(any_note_contains(s.notes(), "cuda:1 (GPU-bbbb) lost"));
  EXPECT_EQ(s.source_status().at("nvml"), "ok");
}

TEST_F(FakeNvml, CudaVisibleDevicesMapsOrdinalsByUuidAndIndex) {
  script("device 0 GPU-aaaa-1 Fake A\n"
         "device 1 GPU-bbbb-2 Fake B\n"
         "device 2 GPU-cccc-3 Fake C\n"
         "gpu_util 0 10\n"
         "gpu_util 1 11\n"
         "gpu_util 2 12\n");
  auto o = nvml_only(FAKE_NVML_LIB);
  o.cuda_visible_devices = "GPU-cccc,0";
  TelemetrySession s(o);
  s.sample_now();
  s.stop();
  const auto gpus = s.gpus();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].uuid, "GPU-cccc-3");
  EXPECT_EQ(gpus[0].device, "cuda:0");
  EXPECT_EQ(gpus[1].uuid, "GPU-aaaa-1");
  const auto samples = s.samples();
  EXPECT_EQ(values_of(samples, "nvml", "cuda:0", "gpu_util_pct"), (std::vector<double>{12}));
  EXPECT_EQ(values_of(samples, "nvml", "cuda:1", "gpu_util_pct"), (std::vector<double>{10}));
  EXPECT_TRUE(values_of(samples, "nvml", "cuda:2", "gpu_util_pct").empty());
}

TEST_F(FakeNvml, CudaVisibleDevicesFromTheEnvironment) {
  script("device 0 GPU-aaaa Fake A\ndevice 1 GPU-bbbb Fake B\n");
  auto o = nvml_only(FAKE_NVML_LIB);
  o.cuda_visible_from_env = true;
  ::setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  TelemetrySession s(o);
  s.sample_now();
  s.stop();
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_EQ(s.gpus().size(), 1u);
  EXPECT_EQ(s.gpus()[0].uuid, "GPU-bbbb");
}

TEST_F(FakeNvml, InitFailureMakesNvmlUnavailableAndTheRestCarriesOn) {
  script("init error 9\ndevice 0 GPU-aaaa Fake A\n");
  TelemetrySession s(nvml_only(FAKE_NVML_LIB));
  s.sample_now();
  s.sample_now();
  s.stop();
  const auto status = s.source_status().at("nvml");
  EXPECT_EQ(status.rfind("unavailable: nvmlInit_v2 failed: Driver Not Loaded", 0), 0u) << status;
  EXPECT_EQ(count_notes_containing(s.notes(), "nvml unavailable"), 1);
  EXPECT_TRUE(s.gpus().empty());
  // The process source still reads.
  EXPECT_EQ(values_of(s.samples(), "process", "process", "rss_bytes").size(), 2u);
}

TEST_F(FakeNvml, MissingLibraryIsUnavailableNotAnError) {
  TelemetrySession s(nvml_only("/nonexistent/libnvidia-ml.so.1"));
  s.sample_now();
  s.stop();
  EXPECT_EQ(s.source_status().at("nvml").rfind("unavailable: cannot load /nonexistent", 0), 0u);
  EXPECT_TRUE(s.summary()["devices"].empty());
}

TEST(ClocksEventReasons, NamesAndThrottleMask) {
  EXPECT_EQ(clocks_event_reason_names(0x1 | 0x4 | 0x1000),
            (std::vector<std::string>{"gpu_idle", "sw_power_cap", "other_0x1000"}));
  EXPECT_EQ(clocks_event_throttle_mask() & 0x1, 0u);
  EXPECT_NE(clocks_event_throttle_mask() & 0x40, 0u);
}

}  // namespace
}  // namespace scalelab
