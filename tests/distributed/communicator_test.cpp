#include "distributed/communicator.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "distributed/single_communicator.h"
#include "thread_world.h"

namespace scalelab {
namespace {

TEST(EvenCounts, SplitsWithAlignmentAndShortTail) {
  EXPECT_EQ(even_counts(10, 3), (std::vector<std::int64_t>{4, 4, 2}));
  EXPECT_EQ(even_counts(10, 3, 4), (std::vector<std::int64_t>{4, 4, 2}));
  EXPECT_EQ(even_counts(5, 4, 4), (std::vector<std::int64_t>{4, 1, 0, 0}));
  EXPECT_EQ(even_counts(0, 2), (std::vector<std::int64_t>{0, 0}));
  EXPECT_EQ(even_counts(100, 3, 16), (std::vector<std::int64_t>{48, 48, 4}));
  const std::vector<std::int64_t> c = even_counts(1001, 3, 16);
  EXPECT_EQ(std::accumulate(c.begin(), c.end(), std::int64_t{0}), 1001);
  EXPECT_EQ(segment_offset(c, 0), 0);
  EXPECT_EQ(segment_offset(c, 2), c[0] + c[1]);
}

TEST(SingleCommunicator, CollectivesAreTheIdentity) {
  SingleCommunicator comm;
  EXPECT_EQ(comm.world_size(), 1);
  std::vector<float> v{1.5f, -2.0f, 3.0f};
  comm.all_reduce(std::span<float>(v), ReduceOp::kAvg);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  EXPECT_EQ(comm.all_reduce_value<std::uint64_t>(42, ReduceOp::kSum), 42u);
  const std::vector<std::int64_t> counts{3};
  std::vector<float> out(3);
  comm.reduce_scatter(v.data(), out.data(), counts, CommDType::kF32, ReduceOp::kSum);
  EXPECT_EQ(out, v);
  comm.all_gather(v.data(), counts, CommDType::kF32);
  comm.broadcast(v.data(), 3, CommDType::kF32, 0);
  comm.barrier();
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  EXPECT_EQ(comm.all_gather_strings("abc"), (std::vector<std::string>{"abc"}));
  EXPECT_EQ(comm.broadcast_string("xyz", 0), "xyz");
}

TEST(SingleCommunicator, RejectsCallerBugs) {
  SingleCommunicator comm;
  std::int64_t x = 1;
  EXPECT_THROW(comm.all_reduce(&x, 1, CommDType::kI64, ReduceOp::kAvg), RuntimeError);
  const std::vector<std::int64_t> two{1, 1};
  EXPECT_THROW(comm.all_gather(&x, two, CommDType::kI64), RuntimeError);
  EXPECT_THROW(comm.broadcast(&x, 1, CommDType::kI64, 1), RuntimeError);
}

TEST(CommunicatorHelpers, StringsAndValuesOverThreeRanks) {
  testing::ThreadWorld world(3);
  world.run([](int r, Communicator& c) {
    const std::vector<std::string> all = c.all_gather_strings(std::string(static_cast<std::size_t>(r), 'a' + static_cast<char>(r)));
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[0], "");
    EXPECT_EQ(all[1], "b");
    EXPECT_EQ(all[2], "cc");
    EXPECT_EQ(c.broadcast_string(r == 2 ? "from two" : "", 2), "from two");
    EXPECT_EQ(c.all_gather_value<std::int64_t>(10 * r), (std::vector<std::int64_t>{0, 10, 20}));
    EXPECT_DOUBLE_EQ(c.all_reduce_value<double>(r + 1.0, ReduceOp::kMax), 3.0);
  });
}

TEST(CommunicatorHelpers, FailureNoticeNamesTheRankThatThrew) {
  testing::ThreadWorld world(2, /*timeout_s=*/30);
  std::string seen_by_rank0;
  EXPECT_THROW(world.run([&](int r, Communicator& c) {
                 if (r == 1) {
                   with_failure_notice(c, []() -> int { throw InvalidInput("boom: bad data file"); });
                 } else {
                   try {
                     c.barrier();
                   } catch (const RuntimeError& e) {
                     seen_by_rank0 = e.what();
                     throw;
                   }
                 }
               }),
               Error);
  EXPECT_NE(seen_by_rank0.find("rank 1 failed: boom: bad data file"), std::string::npos) << seen_by_rank0;
}

}  // namespace
}  // namespace scalelab
