// GradReducer over MPI, under mpirun -np 2: the reduced buffer, the buckets and their order, and
// that communication overlaps backward (asserted on the event log, never on timings).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "../adamw_ref.h"
#include "distributed/ddp.h"
#include "mpi_env.h"

namespace scalelab {
namespace {

using testing::mpi_world;
using testing::test_value;

// Waits for bucket i's all-reduce to complete (polling), or fails after 60 s.
bool wait_bucket(GradReducer& red, int i) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!red.bucket_done(i)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

TEST(DdpMpi, AveragesBucketsInOrderAndOverlapsBackward) {
  MpiCommunicator& c = mpi_world();
  const int n = c.world_size(), r = c.rank();
  const std::int64_t numel = 3'000'017;  // 11.4 MiB
  std::vector<float> g(static_cast<std::size_t>(numel));
  for (std::int64_t i = 0; i < numel; ++i) g[static_cast<std::size_t>(i)] = test_value(r, i);
  DdpOptions opt;
  opt.bucket_mb = 2;
  opt.first_bucket_mb = 0.5;
  GradReducer red(c, g.data(), numel, opt);
  const auto& buckets = red.buckets();
  ASSERT_EQ(buckets.size(), 7u);  // 0.5 MiB, then 5 x 2 MiB, then the 0.94 MiB rest
  EXPECT_EQ(buckets[0].end, numel);
  EXPECT_GE(buckets[0].numel(), 131072);  // 0.5 MiB of fp32, start rounded down to 16 elements
  EXPECT_LT(buckets[0].numel(), 131072 + 16);
  EXPECT_EQ(buckets.back().begin, 0);

  const std::uint64_t ops_before = c.ops_started();
  red.begin_step(true);
  // "Layers" of 1/12 of the buffer each, finished from the last to the first.
  const int layers = 12;
  auto layer = [&](int l) { return std::make_pair(numel * l / layers, numel * (l + 1) / layers); };
  // The last layer covers bucket 0 entirely: its all-reduce must start right away and complete
  // while "backward" has not finished, i.e. before the remaining layers are marked.
  red.mark_ready(layer(layers - 1).first, layer(layers - 1).second);
  ASSERT_TRUE(wait_bucket(red, 0)) << "bucket 0 did not complete before the end of backward";
  for (int l = layers - 2; l >= 0; --l) red.mark_ready(layer(l).first, layer(l).second);
  red.finish();

  for (std::int64_t i = 0; i < numel; i += 7) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += test_value(q, i);
    ASSERT_NEAR(g[static_cast<std::size_t>(i)], sum / n, 1e-6f) << "element " << i;
  }
  ASSERT_NEAR(g[static_cast<std::size_t>(numel - 1)], (test_value(0, numel - 1) + test_value(1, numel - 1)) / 2, 1e-6f);
  EXPECT_EQ(c.ops_started() - ops_before, buckets.size());

  const std::vector<DdpEvent> ev = red.events();
  std::vector<int> launches;
  std::ptrdiff_t done0 = -1, last_mark = -1, finish_begin = -1;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].kind == DdpEvent::Kind::kLaunch) launches.push_back(ev[i].bucket);
    if (ev[i].kind == DdpEvent::Kind::kDone && ev[i].bucket == 0) done0 = static_cast<std::ptrdiff_t>(i);
    if (ev[i].kind == DdpEvent::Kind::kMarkReady) last_mark = static_cast<std::ptrdiff_t>(i);
    if (ev[i].kind == DdpEvent::Kind::kFinishBegin) finish_begin = static_cast<std::ptrdiff_t>(i);
  }
  EXPECT_EQ(launches, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  ASSERT_GE(done0, 0);
  EXPECT_LT(done0, last_mark) << "communication of bucket 0 did not overlap backward";
  EXPECT_LT(last_mark, finish_begin);
  // Every bucket was launched from mark_ready (during backward), none from finish().
  EXPECT_EQ(red.last_step().launched_early, 7);
  EXPECT_GT(red.last_step().comm_s, 0.0);
  EXPECT_GT(red.last_step().hidden_s, 0.0);  // bucket 0 ran entirely before finish()
  EXPECT_LE(red.last_step().exposed_s, red.last_step().comm_s);
}

TEST(DdpMpi, AccumulationCommunicatesOnlyOnTheLastMicroStep) {
  MpiCommunicator& c = mpi_world();
  const std::int64_t numel = 200'000;
  std::vector<float> g(static_cast<std::size_t>(numel), 0.0f);
  GradReducer red(c, g.data(), numel, DdpOptions{0.25, 0.1, true});
  const std::uint64_t ops_before = c.ops_started();
  for (int micro = 0; micro < 3; ++micro) {
    red.begin_step(micro == 2);
    for (std::int64_t i = 0; i < numel; ++i) g[static_cast<std::size_t>(i)] += static_cast<float>(c.rank() + 1);
    for (int l = 3; l >= 0; --l) red.mark_ready(numel * l / 4, numel * (l + 1) / 4);
    red.finish();
    if (micro < 2) {
      EXPECT_EQ(c.ops_started(), ops_before) << "micro-step " << micro << " communicated";
    }
  }
  EXPECT_EQ(c.ops_started() - ops_before, red.buckets().size());
  // Each rank accumulated 3 (rank + 1); the average over 2 ranks is 3 * 1.5.
  EXPECT_FLOAT_EQ(g[0], 3.0f * (c.world_size() + 1) / 2.0f);
  EXPECT_FLOAT_EQ(g[static_cast<std::size_t>(numel - 1)], 3.0f * (c.world_size() + 1) / 2.0f);
}

}  // namespace
}  // namespace scalelab
