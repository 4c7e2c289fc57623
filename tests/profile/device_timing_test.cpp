// Op scopes timed on a device's queue (core/context.h DeviceTiming): with a scripted DeviceTimer,
// the profiler rows and the timeline events carry the device's times, not the host's, nested
// scopes nest, a scope left by an exception is not recorded, and each flush starts a new window.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/allocator.h"
#include "core/context.h"
#include "core/trace.h"
#include "trace_check.h"

namespace scalelab {
namespace {

using nlohmann::json;

// Mark i of a window is reached at times[i] microseconds after mark 0 (0, 10, 30, 60, 100, ...:
// the gaps grow by 10 us), so every duration below is known exactly.
class ScriptedTimer final : public DeviceTimer {
 public:
  int mark() override { return marks_++; }
  std::vector<double> collect() override {
    std::vector<double> at(static_cast<std::size_t>(marks_));
    for (int i = 0; i < marks_; ++i) at[static_cast<std::size_t>(i)] = 5.0 * i * (i + 1);
    ++collects_;
    marks_ = 0;
    return at;
  }
  int marks_ = 0, collects_ = 0;
};

std::vector<json> ops_of(const json& t) {
  std::vector<json> out;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "op") out.push_back(e);
  return out;
}

TEST(DeviceTiming, ScopesTakeTheDevicesTimesWithoutSynchronizing) {
  DeviceAllocator alloc(make_meta_backend(), 1 << 30);  // not the host: scopes use the timer
  Tracer tracer({0, 1, "meta", "scripted"});
  Profiler prof;
  ScriptedTimer timer;
  DeviceTiming timing(timer, &prof, &tracer);
  EXPECT_EQ(timer.collects_, 1);  // the constructor waited for earlier work
  ExecContext ctx{&alloc, &prof};
  ctx.tracer = &tracer;
  ctx.device_timing = &timing;
  {
    ProfileScope outer(ctx, "activation", Phase::kForward);  // marks 1 .. 4
    ProfileScope inner(ctx, "matmul", Phase::kForward);      // marks 2 .. 3
  }
  {
    ProfileScope next(ctx, "norm", Phase::kBackward);  // marks 5 .. 6
  }
  EXPECT_EQ(timing.pending(), 3u);
  EXPECT_TRUE(prof.rows().empty());  // nothing until the flush
  timing.flush();
  EXPECT_EQ(timing.pending(), 0u);
  // Times of marks: 0, 10, 30, 60, 100, 150, 210 us.
  ASSERT_EQ(prof.rows().size(), 3u);
  double act = 0, mm = 0, norm = 0;
  for (const auto& r : prof.rows()) {
    if (r.family == "activation") act = r.entry.seconds;
    if (r.family == "matmul") mm = r.entry.seconds;
    if (r.family == "norm") norm = r.entry.seconds;
  }
  EXPECT_DOUBLE_EQ(act, (100 - 10) * 1e-6);
  EXPECT_DOUBLE_EQ(mm, (60 - 30) * 1e-6);
  EXPECT_DOUBLE_EQ(norm, (210 - 150) * 1e-6);
  const json t = tracer.to_json();
  const auto ops = ops_of(t);
  ASSERT_EQ(ops.size(), 3u);
  const int track = ops[0]["tid"].get<int>();
  EXPECT_GE(track, Tracer::kFirstTrackTid);
  for (const auto& e : ops) EXPECT_EQ(e["tid"], track);
  // The device track is named, and its events nest.
  bool named = false;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == track)
      named = e["args"]["name"] == "GPU: op families (CUDA events)";
  EXPECT_TRUE(named);
  EXPECT_EQ(testing_trace::nesting_error(t), "");
  // Offsets within the window are the device's: matmul starts 20 us after activation.
  double ts_act = 0, ts_mm = 0;
  for (const auto& e : ops) {
    if (e["name"] == "activation") ts_act = e["ts"].get<double>();
    if (e["name"] == "matmul") {
      ts_mm = e["ts"].get<double>();
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 30.0);
    }
  }
  EXPECT_NEAR(ts_mm - ts_act, 20.0, 1e-9);
}

TEST(DeviceTiming, AScopeLeftByAnExceptionIsNotRecorded) {
  DeviceAllocator alloc(make_meta_backend(), 1 << 30);
  Profiler prof;
  ScriptedTimer timer;
  DeviceTiming timing(timer, &prof, nullptr);
  ExecContext ctx{&alloc, &prof};
  ctx.device_timing = &timing;
  try {
    ProfileScope s(ctx, "loss", Phase::kForward);
    throw std::runtime_error("kernel failed");
  } catch (const std::runtime_error&) {
  }
  { ProfileScope ok(ctx, "rope", Phase::kForward); }
  timing.flush();
  ASSERT_EQ(prof.rows().size(), 1u);
  EXPECT_EQ(prof.rows()[0].family, "rope");
}

TEST(DeviceTiming, EachFlushOpensANewWindow) {
  DeviceAllocator alloc(make_meta_backend(), 1 << 30);
  Profiler prof;
  ScriptedTimer timer;
  DeviceTiming timing(timer, &prof, nullptr);
  ExecContext ctx{&alloc, &prof};
  ctx.device_timing = &timing;
  for (int step = 0; step < 3; ++step) {
    { ProfileScope s(ctx, "adamw", Phase::kOptimizer); }  // marks 1 .. 2 of each window: 20 us
    timing.flush();
  }
  EXPECT_EQ(timer.collects_, 4);
  ASSERT_EQ(prof.rows().size(), 1u);
  EXPECT_EQ(prof.rows()[0].entry.calls, 3);
  EXPECT_DOUBLE_EQ(prof.rows()[0].entry.seconds, 3 * 20e-6);
}

TEST(DeviceTiming, HostScopesIgnoreIt) {
  DeviceAllocator alloc(make_host_backend(), 1 << 30);  // the CPU runs synchronously
  Profiler prof;
  ScriptedTimer timer;
  DeviceTiming timing(timer, &prof, nullptr);
  ExecContext ctx{&alloc, &prof};
  ctx.device_timing = &timing;
  { ProfileScope s(ctx, "matmul", Phase::kForward); }
  EXPECT_EQ(timing.pending(), 0u);
  ASSERT_EQ(prof.rows().size(), 1u);  // timed on the host clock at once
}

}  // namespace
}  // namespace scalelab
