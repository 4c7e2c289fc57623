// TelemetrySession: the sampler thread's life cycle (the run ends, fails, or the followed process
// is killed), the engine source, the summary, the CSV file and the long-format samples.
#include "telemetry/session.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "telemetry/sampler.h"
#include "telemetry_test_support.h"

extern char** environ;

namespace scalelab {
namespace {

using test::any_note_contains;
using test::values_of;

pid_t spawn_sleep(const char* seconds) {
  pid_t pid = -1;
  const char* argv[] = {"/bin/sleep", seconds, nullptr};
  EXPECT_EQ(::posix_spawn(&pid, "/bin/sleep", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  return pid;
}

TelemetryOptions quiet(std::chrono::milliseconds interval) {
  TelemetryOptions o;
  o.interval = interval;
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  o.nvidia_smi_path = "/nonexistent/nvidia-smi";
  o.report_unavailable = false;
  return o;
}

TEST(Sampler, TicksAtStartAndAtStopAndStopsWithoutWaitingOutTheInterval) {
  std::atomic<int> ticks{0};
  Sampler s(std::chrono::milliseconds(60000), [&] { ++ticks; });
  const auto t0 = std::chrono::steady_clock::now();
  s.start();
  ASSERT_TRUE(test::wait_until([&] { return ticks.load() >= 1; }));
  s.stop();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ticks.load(), 2);  // the first reading and the final one, nothing in between
  EXPECT_EQ(s.ticks(), 2u);
  EXPECT_LT(waited, 30.0);  // a sleeping sampler would have waited the whole minute
  EXPECT_FALSE(s.running());
  s.stop();  // idempotent
}

TEST(Sampler, TicksRepeatedlyAtItsInterval) {
  std::atomic<int> ticks{0};
  Sampler s(std::chrono::milliseconds(5), [&] { ++ticks; });
  s.start();
  ASSERT_TRUE(test::wait_until([&] { return ticks.load() >= 5; }));
  s.stop();
  const int n = ticks.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ticks.load(), n);  // nothing runs after stop()
  EXPECT_GT(s.thread_cpu_s(), 0.0);
}

TEST(Sampler, RejectsANonPositiveInterval) {
  EXPECT_THROW(Sampler(std::chrono::milliseconds(0), [] {}), InvalidInput);
  EXPECT_THROW(TelemetrySession(quiet(std::chrono::milliseconds(-5))), InvalidInput);
}

TEST(Session, RunThatEndsNormally) {
  TelemetrySession s(quiet(std::chrono::milliseconds(10)));
  s.start();
  ASSERT_TRUE(test::wait_until([&] { return s.readings() >= 4; }));
  s.stop();
  EXPECT_FALSE(s.running());
  const auto n = s.readings();
  EXPECT_EQ(values_of(s.samples(), "process", "process", "rss_bytes").size(), n);
  EXPECT_EQ(s.source_status().at("process"), "ok");
  EXPECT_EQ(s.source_status().at("host"), "ok");
  EXPECT_EQ(s.source_status().at("engine"), "disabled");
  EXPECT_EQ(s.source_status().at("nvml").rfind("unavailable: ", 0), 0u);
  EXPECT_EQ(s.source_status().at("nvidia-smi").rfind("unavailable: ", 0), 0u);
  // Each unavailable source is noted exactly once.
  int nvml_notes = 0;
  for (const auto& note : s.notes()) nvml_notes += note.rfind("nvml unavailable", 0) == 0;
  EXPECT_EQ(nvml_notes, 1);
  s.stop();
  EXPECT_EQ(s.readings(), n);
}

TEST(Session, RunThatFailsStopsTheSamplerThroughTheDestructor) {
  std::atomic<int> engine_calls{0};
  auto o = quiet(std::chrono::milliseconds(5));
  o.engine = {{"cpu", [&] {
                 ++engine_calls;
                 return MemoryStats{};
               }}};
  try {
    TelemetrySession s(o);
    s.start();
    ASSERT_TRUE(test::wait_until([&] { return engine_calls.load() >= 3; }));
    throw std::runtime_error("the training run failed");
  } catch (const std::runtime_error&) {
  }
  const int n = engine_calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(engine_calls.load(), n);  // the sampler thread is gone
}

TEST(Session, EngineCallbackThatThrowsIsNotedOnceAndTheRestCarriesOn) {
  int calls = 0;
  auto o = quiet(std::chrono::milliseconds(10));
  o.engine = {{"cuda:0", [&]() -> MemoryStats {
                 if (++calls == 2) throw std::runtime_error("allocator gone");
                 MemoryStats m;
                 m.allocated = 100;
                 return m;
               }}};
  TelemetrySession s(o);
  for (int i = 0; i < 4; ++i) s.sample_now();
  s.stop();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(values_of(s.samples(), "engine", "cuda:0", "allocated_bytes"), (std::vector<double>{100}));
  EXPECT_EQ(values_of(s.samples(), "process", "process", "rss_bytes").size(), 4u);
  int n = 0;
  for (const auto& note : s.notes()) n += note.find("allocator gone") != std::string::npos;
  EXPECT_EQ(n, 1);
}

TEST(Session, FollowedChildKilledMidSampling) {
  const pid_t child = spawn_sleep("30");
  ASSERT_GT(child, 0);
  auto o = quiet(std::chrono::milliseconds(10));
  o.root_pid = child;
  TelemetrySession s(o);
  s.start();
  ASSERT_TRUE(test::wait_until([&] {
    return values_of(s.samples(), "process", "process", "rss_bytes").size() >= 3;
  }));
  ::kill(child, SIGKILL);  // a zombie until reaped: the source sees it has ended
  ASSERT_TRUE(test::wait_until([&] { return any_note_contains(s.notes(), "ended"); }));
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);  // reaped: /proc/<pid> is gone
  EXPECT_TRUE(WIFSIGNALED(st));
  const auto before = s.readings();
  ASSERT_TRUE(test::wait_until([&] { return s.readings() >= before + 3; }));  // still sampling
  s.stop();
  const auto samples = s.samples();
  const auto rss = values_of(samples, "process", "process", "rss_bytes");
  EXPECT_GE(rss.size(), 3u);
  EXPECT_LT(rss.size(), s.readings());  // no process readings after it ended
  EXPECT_GT(values_of(samples, "host", "host", "mem_used_bytes").size(), rss.size());
  EXPECT_EQ(s.summary()["root_pid"].get<int>(), child);
  int ended = 0;
  for (const auto& n : s.notes()) ended += n.find("ended") != std::string::npos;
  EXPECT_EQ(ended, 1);
}

TEST(Session, ChildThatFinishesBeforeStop) {
  const pid_t child = spawn_sleep("0.2");
  auto o = quiet(std::chrono::milliseconds(10));
  o.root_pid = child;
  TelemetrySession s(o);
  s.start();
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  EXPECT_TRUE(WIFEXITED(st));
  ASSERT_TRUE(test::wait_until([&] { return any_note_contains(s.notes(), "ended"); }));
  s.stop();
  EXPECT_FALSE(s.running());
}

TEST(Session, EngineMemoryAgainstNvmlAgreement) {
  test::TempDir dir;
  test::write_file(dir / "nvml.txt", "device 0 GPU-aaaa Fake A\nmem_used 0 1000 2000 4000 8000\n");
  ::setenv("FAKE_NVML_SCRIPT", (dir / "nvml.txt").c_str(), 1);
  const std::vector<std::size_t> reserved = {1100, 2100, 4100, 8100};
  std::size_t i = 0;
  auto o = quiet(std::chrono::milliseconds(200));
  o.nvml_library = FAKE_NVML_LIB;
  o.cuda_visible_from_env = false;
  o.engine = {{"cuda:0", [&] {
                 MemoryStats m;
                 m.reserved = reserved[std::min(i++, reserved.size() - 1)];
                 m.allocated = m.reserved / 2;
                 m.peak_reserved = m.reserved;
                 return m;
               }}};
  TelemetrySession s(o);
  for (int k = 0; k < 4; ++k) s.sample_now();
  s.stop();
  const auto j = s.summary();
  const nlohmann::json* row = nullptr;
  for (const auto& r : j["agreement"])
    if (r["a"]["source"] == "nvml" && r["b"]["source"] == "engine") row = &r;
  ASSERT_NE(row, nullptr) << j["agreement"].dump();
  EXPECT_EQ((*row)["quantity"], "mem_used_bytes");
  EXPECT_EQ((*row)["b"]["metric"], "reserved_bytes");
  EXPECT_EQ((*row)["n"].get<int>(), 4);
  EXPECT_NEAR((*row)["pearson_r"].get<double>(), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ((*row)["mean_diff"].get<double>(), 100.0);
  const auto& eng = j["devices"]["cuda:0"]["metrics"]["engine"];
  EXPECT_DOUBLE_EQ(eng["reserved_bytes"]["max"].get<double>(), 8100.0);
  EXPECT_DOUBLE_EQ(eng["allocated_bytes"]["avg"].get<double>(), (550 + 1050 + 2050 + 4050) / 4.0);
}

TEST(Session, SummaryOfAHostOnlyRun) {
  auto o = quiet(std::chrono::milliseconds(10));
  o.sys_root = "/nonexistent-sys";  // no RAPL, whatever machine runs this
  TelemetrySession s(o);
  s.sample_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  s.sample_now();
  s.stop();
  const auto j = s.summary(1000.0);
  EXPECT_EQ(j["interval_ms"], 10);
  EXPECT_EQ(j["readings"], 2);
  EXPECT_EQ(j["tokens"], 1000.0);
  EXPECT_TRUE(j["devices"].empty());
  EXPECT_TRUE(j["process"].contains("rss_bytes"));
  EXPECT_TRUE(j["process"].contains("cpu_util_pct"));
  EXPECT_TRUE(j["host"].contains("mem_used_bytes"));
  EXPECT_TRUE(j["energy_j"].is_null());  // no GPU and no RAPL
  EXPECT_TRUE(any_note_contains(j["notes"].get<std::vector<std::string>>(), "RAPL unavailable"));
  EXPECT_GE(j["sampling"]["cpu_s"].get<double>(), 0.0);
  EXPECT_TRUE(j["agreement"].empty());
}

TEST(Session, CsvHasOneRowPerSamplePerDeviceWithASourceColumn) {
  test::TempDir dir;
  test::write_file(dir / "nvml.txt",
                   "device 0 GPU-aaaa Fake A\ndevice 1 GPU-bbbb Fake B\ngpu_util 0 7\ngpu_util 1 9\n");
  ::setenv("FAKE_NVML_SCRIPT", (dir / "nvml.txt").c_str(), 1);
  auto o = quiet(std::chrono::milliseconds(10));
  o.nvml_library = FAKE_NVML_LIB;
  o.cuda_visible_from_env = false;
  TelemetrySession s(o);
  s.sample_now();
  s.sample_now();
  s.stop();
  s.write_csv(dir / "t.csv");
  std::istringstream in(test::read_file(dir / "t.csv"));
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("t_s,source,device,gpu_util_pct,mem_util_pct,", 0), 0u) << header;
  int nvml_rows = 0, process_rows = 0, host_rows = 0;
  std::size_t columns = std::count(header.begin(), header.end(), ',');
  while (std::getline(in, line)) {
    EXPECT_EQ(static_cast<std::size_t>(std::count(line.begin(), line.end(), ',')), columns) << line;
    if (line.find(",nvml,cuda:") != std::string::npos) {
      ++nvml_rows;
      EXPECT_TRUE(line.find(",nvml,cuda:0,7,") != std::string::npos ||
                  line.find(",nvml,cuda:1,9,") != std::string::npos)
          << line;
    }
    process_rows += line.find(",process,process,") != std::string::npos;
    host_rows += line.find(",host,host,") != std::string::npos;
  }
  EXPECT_EQ(nvml_rows, 4);  // 2 readings x 2 devices
  EXPECT_EQ(process_rows, 2);
  EXPECT_EQ(host_rows, 2);
  EXPECT_THROW(s.write_csv(dir / "no/such/dir/t.csv"), InvalidInput);
}

TEST(Session, LongFormatSamples) {
  TelemetrySession s(quiet(std::chrono::milliseconds(10)));
  s.sample_now();
  s.stop();
  const auto samples = s.samples();
  ASSERT_FALSE(samples.empty());
  for (const auto& x : samples) {
    EXPECT_FALSE(x.source.empty());
    EXPECT_FALSE(x.device.empty());
    EXPECT_FALSE(x.metric.empty());
    EXPECT_GE(x.t_s, 0.0);
  }
  // Round trip through the long format (what the results store keeps) gives the same series.
  TimeSeries back(samples);
  EXPECT_EQ(back.samples().size(), samples.size());
  EXPECT_EQ(back.series().size(), s.series().series().size());
}

}  // namespace
}  // namespace scalelab
