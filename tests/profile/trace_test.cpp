// The tracer (core/trace.h): events from op and region scopes, thread ids, counters from the
// allocator, the rank file names, merging the ranks' files.
#include <gtest/gtest.h>

#include <thread>

#include "core/allocator.h"
#include "core/context.h"
#include "core/error.h"
#include "core/trace.h"
#include "trace_check.h"

namespace scalelab {
namespace {

using nlohmann::json;

std::vector<json> of_ph(const json& t, const char* ph) {
  std::vector<json> out;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == ph) out.push_back(e);
  return out;
}

TEST(Trace, ScopesRecordNestedCompleteEventsWithPhaseAndIndex) {
  DeviceAllocator alloc(make_host_backend(), 1 << 30);
  Tracer tracer({0, 1, "cpu", "test cpu"});
  ExecContext ctx{&alloc, nullptr};
  ctx.tracer = &tracer;
  {
    RegionScope fwd(ctx, "forward", Phase::kForward);
    RegionScope layer(ctx, "layer", 3, Phase::kForward);
    ProfileScope op(ctx, "matmul", Phase::kForward);
    ProfileScope inner(ctx, "activation", Phase::kForward);
  }
  const json t = tracer.to_json();
  const auto xs = of_ph(t, "X");
  ASSERT_EQ(xs.size(), 4u);
  // Recorded as they end: innermost first.
  EXPECT_EQ(xs[0]["name"], "activation");
  EXPECT_EQ(xs[0]["cat"], "op");
  EXPECT_EQ(xs[0]["args"]["phase"], "forward");
  EXPECT_EQ(xs[2]["name"], "layer 3");
  EXPECT_EQ(xs[2]["cat"], "layer");
  EXPECT_EQ(xs[2]["args"]["index"], 3);
  EXPECT_EQ(xs[3]["name"], "forward");
  EXPECT_EQ(xs[3]["cat"], "phase");
  for (const auto& e : xs) EXPECT_EQ(e["tid"], Tracer::kMainTid);
  EXPECT_EQ(testing_trace::nesting_error(t), "");
  EXPECT_GE(xs[3]["dur"].get<double>(), xs[0]["dur"].get<double>());
  // Metadata: the process named after rank and device, the main thread named.
  bool pname = false, tname = false;
  for (const auto& m : of_ph(t, "M")) {
    if (m["name"] == "process_name") pname = m["args"]["name"].get<std::string>().find("rank 0") == 0;
    if (m["name"] == "thread_name" && m["tid"] == 0) tname = m["args"]["name"] == "main";
  }
  EXPECT_TRUE(pname);
  EXPECT_TRUE(tname);
  EXPECT_EQ(t["otherData"]["generator"], "scalelab");
  EXPECT_EQ(t["otherData"]["device_description"], "test cpu");
}

TEST(Trace, NothingIsRecordedWithoutATracer) {
  DeviceAllocator alloc(make_host_backend(), 1 << 30);
  Tracer tracer({});
  ExecContext ctx{&alloc, nullptr};
  {
    RegionScope fwd(ctx, "forward", Phase::kForward);
    ProfileScope op(ctx, "matmul", Phase::kForward);
  }
  EXPECT_EQ(tracer.size(), 0u);
}

TEST(Trace, OtherThreadsGetTheirOwnTid) {
  Tracer tracer({});
  const auto t0 = Tracer::Clock::now();
  tracer.complete("main work", "op", t0, t0);
  std::thread th([&] { tracer.complete("worker work", "op", t0, Tracer::Clock::now()); });
  th.join();
  tracer.complete("comm", "comm", t0, t0, "comm", 0, 64, Tracer::kCommTid);
  const auto xs = of_ph(tracer.to_json(), "X");
  ASSERT_EQ(xs.size(), 3u);
  EXPECT_EQ(xs[0]["tid"], 0);
  EXPECT_GE(xs[1]["tid"].get<int>(), 2);
  EXPECT_EQ(xs[2]["tid"], Tracer::kCommTid);
  EXPECT_EQ(xs[2]["args"]["bytes"], 64);
  // A thread's id under a new tracer starts afresh.
  Tracer second({});
  second.complete("again", "op", t0, t0);
  EXPECT_EQ(of_ph(second.to_json(), "X")[0]["tid"], 0);
}

TEST(Trace, AllocatorUsageBecomesMemoryCounters) {
  DeviceAllocator alloc(make_host_backend(), 1 << 30);
  Tracer tracer({});
  alloc.set_usage_observer(
      [](void* u, std::size_t a, std::size_t r) {
        auto* t = static_cast<Tracer*>(u);
        t->counter("allocated memory", Tracer::Clock::now(), "bytes", static_cast<double>(a));
        t->counter("reserved memory", Tracer::Clock::now(), "bytes", static_cast<double>(r));
      },
      &tracer);
  void* p = alloc.allocate(4096);
  alloc.deallocate(p);
  alloc.set_usage_observer(nullptr, nullptr);
  alloc.deallocate(alloc.allocate(512));  // not observed
  const auto cs = of_ph(tracer.to_json(), "C");
  ASSERT_EQ(cs.size(), 4u);
  EXPECT_EQ(cs[0]["name"], "allocated memory");
  EXPECT_EQ(cs[0]["args"]["bytes"], 4096.0);
  EXPECT_EQ(cs[1]["args"]["bytes"], static_cast<double>(DeviceAllocator::kSegmentBytes));
  EXPECT_EQ(cs[2]["args"]["bytes"], 0.0);
}

TEST(Trace, EventsBeyondTheLimitAreCountedNotKept) {
  Tracer tracer({}, 2);
  const auto t0 = Tracer::Clock::now();
  for (int i = 0; i < 5; ++i) tracer.complete("x", "op", t0, t0);
  EXPECT_EQ(tracer.size(), 2u);
  EXPECT_EQ(tracer.to_json()["otherData"]["dropped_events"], 3);
}

TEST(Trace, RankFileNames) {
  EXPECT_EQ(trace_path_for_rank("run.trace.json", 0, 1), "run.trace.json");
  EXPECT_EQ(trace_path_for_rank("run.trace.json", 1, 2), "run.trace.rank1.json");
  EXPECT_EQ(trace_path_for_rank("out/run.json", 0, 4), "out/run.rank0.json");
  EXPECT_EQ(trace_path_for_rank("out.d/trace", 3, 4), "out.d/trace.rank3");
  EXPECT_EQ(trace_path_for_rank(".trace", 1, 2), ".trace.rank1");
}

TEST(Trace, MergeAlignsRanksOnTheWallClock) {
  auto make = [](int rank, std::int64_t origin, double ts) {
    return json{{"traceEvents",
                 json::array({{{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0}, {"args", {{"name", "r"}}}},
                              {{"ph", "X"}, {"name", "step 0"}, {"cat", "step"}, {"pid", rank}, {"tid", 0}, {"ts", ts}, {"dur", 5.0}}})},
                {"otherData", {{"generator", "scalelab"}, {"rank", rank}, {"world_size", 2}, {"origin_unix_us", origin},
                               {"measured_from_us", ts}}}};
  };
  const json m = merge_traces({make(0, 1000, 10), make(1, 1250, 10)});
  std::map<int, double> ts;
  for (const auto& e : m["traceEvents"])
    if (e["ph"] == "X") ts[e["pid"].get<int>()] = e["ts"].get<double>();
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_DOUBLE_EQ(ts[0], 10);
  EXPECT_DOUBLE_EQ(ts[1], 260);  // started 250 us later on the wall clock
  EXPECT_EQ(m["otherData"]["ranks"], 2);
  EXPECT_EQ(m["otherData"]["inputs"][1]["shift_us"], 250.0);
  EXPECT_THROW(merge_traces({make(0, 1, 0), make(0, 2, 0)}), InvalidInput);
  EXPECT_THROW(merge_traces({json{{"traceEvents", json::array()}}}), InvalidInput);
  EXPECT_THROW(merge_traces({}), InvalidInput);
}

}  // namespace
}  // namespace scalelab
