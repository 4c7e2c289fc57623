// MpiCommunicator's collectives, config check and launcher consistency, under mpirun -np 2.
#include <gtest/gtest.h>

#include <numeric>

#include "../adamw_ref.h"
#include "core/error.h"
#include "distributed/config_check.h"
#include "distributed/launch_env.h"
#include "mpi_env.h"

namespace scalelab {
namespace {

using testing::mpi_world;
using testing::test_value;

TEST(MpiCommunicator, WorldMatchesTheLauncher) {
  MpiCommunicator& c = mpi_world();
  const LaunchEnv env = detect_launch_env();
  EXPECT_EQ(env.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(c.world_size(), env.world_size);
  EXPECT_EQ(c.rank(), env.rank);
  EXPECT_EQ(c.local_rank(), env.local_rank);
  EXPECT_GE(c.world_size(), 2) << "run under mpirun -np 2";
  EXPECT_STREQ(c.backend(), "mpi");
}

TEST(MpiCommunicator, AllReduceOpsAndTypes) {
  MpiCommunicator& c = mpi_world();
  const int n = c.world_size(), r = c.rank();
  const std::int64_t count = 100'003;
  std::vector<float> f(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) f[static_cast<std::size_t>(i)] = test_value(r, i);
  std::vector<float> avg = f, mx = f, mn = f;
  c.all_reduce(std::span<float>(f), ReduceOp::kSum);
  c.all_reduce(std::span<float>(avg), ReduceOp::kAvg);
  c.all_reduce(std::span<float>(mx), ReduceOp::kMax);
  c.all_reduce(std::span<float>(mn), ReduceOp::kMin);
  for (std::int64_t i = 0; i < count; i += 101) {
    float sum = 0, hi = -2, lo = 2;
    for (int q = 0; q < n; ++q) {
      sum += test_value(q, i);
      hi = std::max(hi, test_value(q, i));
      lo = std::min(lo, test_value(q, i));
    }
    ASSERT_NEAR(f[static_cast<std::size_t>(i)], sum, 1e-6f);
    ASSERT_NEAR(avg[static_cast<std::size_t>(i)], sum / n, 1e-6f);
    ASSERT_EQ(mx[static_cast<std::size_t>(i)], hi);
    ASSERT_EQ(mn[static_cast<std::size_t>(i)], lo);
  }
  EXPECT_DOUBLE_EQ(c.all_reduce_value<double>(0.25 * (r + 1), ReduceOp::kSum), 0.25 * n * (n + 1) / 2);
  EXPECT_EQ(c.all_reduce_value<std::uint64_t>(std::uint64_t{1} << (40 + r), ReduceOp::kMax),
            std::uint64_t{1} << (40 + n - 1));
  EXPECT_EQ(c.all_reduce_value<std::int64_t>(-5 - r, ReduceOp::kMin), -5 - (n - 1));
  std::uint8_t bytes[3] = {static_cast<std::uint8_t>(r), 7, static_cast<std::uint8_t>(200 + r)};
  c.all_reduce(bytes, 3, CommDType::kU8, ReduceOp::kMax);
  EXPECT_EQ(bytes[0], n - 1);
  EXPECT_EQ(bytes[2], 200 + n - 1);
  // Zero elements is a valid collective.
  c.all_reduce(f.data(), 0, CommDType::kF32, ReduceOp::kSum);
  std::int64_t x = 1;
  EXPECT_THROW(c.all_reduce(&x, 1, CommDType::kI64, ReduceOp::kAvg), RuntimeError);
}

TEST(MpiCommunicator, BroadcastGatherScatterWithUnevenSegments) {
  MpiCommunicator& c = mpi_world();
  const int n = c.world_size(), r = c.rank();
  std::vector<double> b(5, r == n - 1 ? 3.5 : 0.0);
  c.broadcast(b.data(), 5, CommDType::kF64, n - 1);
  EXPECT_EQ(b, std::vector<double>(5, 3.5));

  // Uneven: rank q contributes q + 3 elements valued 100 q + i.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) counts[static_cast<std::size_t>(q)] = q + 3;
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  std::vector<float> g(static_cast<std::size_t>(total), -1.0f);
  const std::int64_t off = segment_offset(counts, r);
  for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
    g[static_cast<std::size_t>(off + i)] = static_cast<float>(100 * r + i);
  c.all_gather(g.data(), counts, CommDType::kF32);
  for (int q = 0; q < n; ++q)
    for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
      EXPECT_EQ(g[static_cast<std::size_t>(segment_offset(counts, q) + i)], static_cast<float>(100 * q + i));

  std::vector<float> send(static_cast<std::size_t>(total));
  for (std::int64_t i = 0; i < total; ++i) send[static_cast<std::size_t>(i)] = test_value(r, i);
  std::vector<float> recv(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
  c.reduce_scatter(send.data(), recv.data(), counts, CommDType::kF32, ReduceOp::kAvg);
  for (std::size_t i = 0; i < recv.size(); ++i) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += test_value(q, off + static_cast<std::int64_t>(i));
    EXPECT_NEAR(recv[i], sum / n, 1e-6f);
  }
  c.barrier();
  EXPECT_EQ(c.all_gather_strings("rank" + std::to_string(r))[static_cast<std::size_t>(n - 1)], "rank" + std::to_string(n - 1));
}

TEST(MpiCommunicator, AsyncCollectivesRunInIssueOrderAndOverlapTheCaller) {
  MpiCommunicator& c = mpi_world();
  const std::uint64_t started_before = c.ops_started();
  std::vector<std::vector<float>> bufs(4, std::vector<float>(1 << 18, 1.0f));
  std::vector<std::unique_ptr<CommWork>> works;
  for (auto& b : bufs) works.push_back(c.all_reduce_async(b.data(), static_cast<std::int64_t>(b.size()), CommDType::kF32, ReduceOp::kSum));
  // The caller is free while they run; wait in reverse order.
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (std::size_t i = 1; i < works.size(); ++i) EXPECT_LE(works[i - 1]->finished(), works[i]->started());
  for (auto& b : bufs) EXPECT_EQ(b[12345], static_cast<float>(c.world_size()));
  EXPECT_EQ(c.ops_started() - started_before, 4u);
  EXPECT_EQ(c.ops_completed(), c.ops_started());
}

TEST(MpiCommunicator, ConfigMismatchNamesRankAndKey) {
  MpiCommunicator& c = mpi_world();
  nlohmann::json cfg = {{"model", "llama-small"}, {"seq_len", 256}, {"json", "r" + std::to_string(c.rank())}};
  check_same_config(c, cfg, {"json"});
  if (c.rank() == 1) cfg["seq_len"] = 512;
  try {
    check_same_config(c, cfg, {"json"});
    ADD_FAILURE() << "no mismatch reported";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 differs from rank 0 in seq_len (rank 1: 512, rank 0: 256)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace scalelab
