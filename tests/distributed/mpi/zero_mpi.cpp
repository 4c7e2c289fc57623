// ZeRO-1 and the data-parallel facade over MPI, under mpirun -np 2: the sharded update equals the
// unsharded one within fp32 reduction-order tolerance.
#include <gtest/gtest.h>

#include <cmath>

#include "../adamw_ref.h"
#include "distributed/data_parallel.h"
#include "distributed/zero.h"
#include "mpi_env.h"

namespace scalelab {
namespace {

using testing::AdamWRef;
using testing::mpi_world;
using testing::test_value;

TEST(ZeroMpi, ShardedAdamWEqualsUnshardedWithGlobalNormClipping) {
  MpiCommunicator& c = mpi_world();
  const int n = c.world_size(), r = c.rank();
  const std::int64_t numel = 250'001;
  const int steps = 3;
  const float max_norm = 50.0f;

  // Reference, computed locally: average of every rank's gradient, clipped, AdamW on everything.
  std::vector<float> ref(static_cast<std::size_t>(numel)), gavg(static_cast<std::size_t>(numel));
  for (std::int64_t i = 0; i < numel; ++i) ref[static_cast<std::size_t>(i)] = test_value(77, i);
  AdamWRef ref_opt;
  ref_opt.init(0, numel);

  std::vector<float> params = ref, grads(static_cast<std::size_t>(numel));
  AdamWRef opt;
  ZeroOptimizer zero(c, params.data(), grads.data(), numel,
                     [&](std::int64_t b, std::int64_t e) { opt.update(params.data(), grads.data(), b, e); });
  opt.init(zero.shard_begin(), zero.shard_end());
  EXPECT_EQ(zero.shard_numel(), even_counts(numel, n, 16)[static_cast<std::size_t>(r)]);
  EXPECT_LE(opt.m.size(), static_cast<std::size_t>(numel / n + 16));

  for (int s = 0; s < steps; ++s) {
    double sq = 0;
    for (std::int64_t i = 0; i < numel; ++i) {
      float sum = 0;
      for (int q = 0; q < n; ++q) sum += test_value(q, i, s);
      gavg[static_cast<std::size_t>(i)] = sum / static_cast<float>(n);
      sq += static_cast<double>(gavg[static_cast<std::size_t>(i)]) * gavg[static_cast<std::size_t>(i)];
      grads[static_cast<std::size_t>(i)] = test_value(r, i, s);
    }
    const double ref_norm = std::sqrt(sq);
    ref_opt.clip = static_cast<float>(std::min(1.0, max_norm / (ref_norm + 1e-6)));
    ref_opt.step = s + 1;
    ref_opt.update(ref.data(), gavg.data(), 0, numel);

    const double norm = zero.reduce_gradients();
    EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm);
    opt.clip = static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
    opt.step = s + 1;
    zero.update_and_gather();
  }
  double max_diff = 0;
  for (std::int64_t i = 0; i < numel; ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(params[static_cast<std::size_t>(i)] - ref[static_cast<std::size_t>(i)])));
  EXPECT_LT(max_diff, 1e-6) << "sharded and unsharded AdamW differ";
  EXPECT_GT(zero.stats().reduce_scatter_s, 0.0);
}

TEST(DataParallelMpi, DdpAndZeroOneAgree) {
  MpiCommunicator& c = mpi_world();
  const std::int64_t numel = 100'003;
  std::vector<std::vector<float>> finals;
  for (int stage : {0, 1}) {
    std::vector<float> params(static_cast<std::size_t>(numel)), grads(static_cast<std::size_t>(numel));
    for (std::int64_t i = 0; i < numel; ++i) params[static_cast<std::size_t>(i)] = test_value(5, i);
    AdamWRef opt;
    DataParallelOptions o;
    o.zero_stage = stage;
    o.ddp.bucket_mb = 0.1;
    o.ddp.first_bucket_mb = 0.05;
    DataParallel dp(c, params.data(), grads.data(), numel, o,
                    [&](std::int64_t b, std::int64_t e) { opt.update(params.data(), grads.data(), b, e); });
    opt.init(dp.optimizer_begin(), dp.optimizer_end());
    for (int s = 0; s < 2; ++s) {
      dp.begin_micro_step(true);
      for (std::int64_t i = 0; i < numel; ++i) grads[static_cast<std::size_t>(i)] = test_value(c.rank(), i, s);
      for (int l = 4; l >= 0; --l) dp.mark_ready(numel * l / 5, numel * (l + 1) / 5);
      const double norm = dp.end_backward();
      opt.clip = static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6)));
      opt.step = s + 1;
      dp.optimizer_step();
    }
    finals.push_back(params);
  }
  for (std::int64_t i = 0; i < numel; ++i)
    ASSERT_NEAR(finals[0][static_cast<std::size_t>(i)], finals[1][static_cast<std::size_t>(i)], 1e-6f) << "element " << i;
}

}  // namespace
}  // namespace scalelab
