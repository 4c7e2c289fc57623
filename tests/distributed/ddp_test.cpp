#include "distributed/ddp.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "adamw_ref.h"
#include "core/error.h"
#include "distributed/single_communicator.h"
#include "thread_world.h"

namespace scalelab {
namespace {

using testing::test_value;

TEST(PlanGradBuckets, ReverseOrderSmallFirstBucketAlignedBoundaries) {
  const std::int64_t n = 1'000'003;
  const auto b = plan_grad_buckets(n, 4, /*first*/ 1.0, /*bucket*/ 1.5, 16);
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b.front().end, n);
  EXPECT_EQ(b.back().begin, 0);
  const std::int64_t first = 262144, rest = 393216;  // 1 MiB and 1.5 MiB of fp32
  // Bucket 0 covers the end of the buffer: its start rounded down to 16 elements.
  EXPECT_EQ(b[0].begin, (n - first) / 16 * 16);
  for (std::size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].index, static_cast<int>(i));
    if (i + 1 < b.size()) {
      EXPECT_EQ(b[i + 1].end, b[i].begin);  // contiguous, descending
      EXPECT_EQ(b[i].begin % 16, 0);
      EXPECT_GE(b[i].numel(), i == 0 ? first : rest);
      EXPECT_LT(b[i].numel(), (i == 0 ? first : rest) + 16);
    } else {
      EXPECT_LE(b[i].numel(), rest + 16);
    }
  }
}

TEST(PlanGradBuckets, SmallBufferIsOneBucketAndBadSizesAreInvalidInput) {
  const auto b = plan_grad_buckets(1000, 4, 1.0, 25.0);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, 1000);
  EXPECT_TRUE(plan_grad_buckets(0, 4, 1.0, 25.0).empty());
  EXPECT_THROW(plan_grad_buckets(1000, 4, 1.0, 0.0), InvalidInput);
  EXPECT_THROW(plan_grad_buckets(1000, 4, -1.0, 25.0), InvalidInput);
}

// "Layers" of a fake model over n elements: ready in reverse order, as backward produces them.
std::vector<std::pair<std::int64_t, std::int64_t>> reverse_layers(std::int64_t n, int layers) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (int l = layers - 1; l >= 0; --l) out.emplace_back(n * l / layers, n * (l + 1) / layers);
  return out;
}

TEST(GradReducer, AveragesOverRanksLaunchingBucketsDuringBackward) {
  const int world_n = 3;
  const std::int64_t n = 600'000;  // 2.3 MiB: buckets of 0.25 MiB first, then 0.5 MiB
  testing::ThreadWorld world(world_n);
  world.run([&](int r, Communicator& c) {
    std::vector<float> g(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = test_value(r, i);
    GradReducer red(c, g.data(), n, DdpOptions{0.5, 0.25, true});
    ASSERT_GE(red.buckets().size(), 4u);
    red.begin_step(true);
    const auto layers = reverse_layers(n, 10);
    for (const auto& [b, e] : layers) red.mark_ready(b, e);
    red.finish();
    for (std::int64_t i = 0; i < n; i += 997) {
      float sum = 0;
      for (int q = 0; q < world_n; ++q) sum += test_value(q, i);
      ASSERT_NEAR(g[static_cast<std::size_t>(i)], sum / world_n, 1e-6f) << "element " << i;
    }
    // Every bucket was launched in index order, and all but the ones completed by the last
    // layer went out before backward ended (before the last mark_ready).
    const std::vector<DdpEvent> ev = red.events();
    std::vector<int> launch_order;
    std::ptrdiff_t last_mark = -1, first_launch = -1;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].kind == DdpEvent::Kind::kLaunch) {
        launch_order.push_back(ev[i].bucket);
        if (first_launch < 0) first_launch = static_cast<std::ptrdiff_t>(i);
      }
      if (ev[i].kind == DdpEvent::Kind::kMarkReady) last_mark = static_cast<std::ptrdiff_t>(i);
    }
    std::vector<int> expected(red.buckets().size());
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int>(i);
    EXPECT_EQ(launch_order, expected);
    EXPECT_LT(first_launch, last_mark);
    EXPECT_EQ(red.last_step().buckets, static_cast<std::int64_t>(red.buckets().size()));
    EXPECT_EQ(red.last_step().launched_early, static_cast<std::int64_t>(red.buckets().size()));
    EXPECT_EQ(red.last_step().bytes, n * 4);
  });
}

TEST(GradReducer, AccumulationMicroStepsDoNotCommunicate) {
  testing::ThreadWorld world(2);
  const std::int64_t n = 5000;
  world.run([&](int r, Communicator& c) {
    std::vector<float> g(static_cast<std::size_t>(n), 1.0f + static_cast<float>(r));
    GradReducer red(c, g.data(), n);
    const std::int64_t before = world.collectives(r);
    red.begin_step(false);
    red.mark_ready(0, n);
    red.finish();
    EXPECT_EQ(world.collectives(r), before);
    EXPECT_EQ(g[0], 1.0f + static_cast<float>(r));  // untouched
    red.begin_step(true);
    red.finish();  // nothing marked: everything goes out at finish()
    EXPECT_EQ(world.collectives(r), before + static_cast<std::int64_t>(red.buckets().size()));
    EXPECT_FLOAT_EQ(g[0], 1.5f);
    EXPECT_FLOAT_EQ(g[n - 1], 1.5f);
    EXPECT_EQ(red.last_step().launched_early, 0);
    EXPECT_EQ(red.total().steps, 1);
  });
}

TEST(GradReducer, SumInsteadOfAverageAndSingleProcess) {
  std::vector<float> g{1, 2, 3};
  SingleCommunicator single;
  GradReducer red(single, g.data(), 3, DdpOptions{25, 1, false});
  red.begin_step(true);
  red.mark_ready(1, 3);
  red.mark_ready(0, 1);
  red.finish();
  EXPECT_EQ(g, (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(red.bucket_done(0));

  testing::ThreadWorld world(2);
  world.run([&](int r, Communicator& c) {
    std::vector<float> h(100, static_cast<float>(r + 1));
    GradReducer sum(c, h.data(), 100, DdpOptions{25, 1, false});
    sum.begin_step(true);
    sum.finish();
    EXPECT_EQ(h[42], 3.0f);
  });
}

TEST(GradReducer, RejectsOverlappingAndOutOfRangeMarks) {
  std::vector<float> g(100);
  SingleCommunicator single;
  GradReducer red(single, g.data(), 100);
  EXPECT_THROW(red.mark_ready(0, 10), RuntimeError);  // before begin_step
  red.begin_step(true);
  red.mark_ready(50, 100);
  EXPECT_THROW(red.mark_ready(40, 60), RuntimeError);
  EXPECT_THROW(red.mark_ready(99, 100), RuntimeError);
  EXPECT_THROW(red.mark_ready(90, 120), RuntimeError);
  red.mark_ready(10, 50);
  EXPECT_THROW(red.mark_ready(0, 11), RuntimeError);
  red.mark_ready(0, 10);
  red.finish();
}

}  // namespace
}  // namespace scalelab
