#include "distributed/zero.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "adamw_ref.h"
#include "core/error.h"
#include "distributed/data_parallel.h"
#include "distributed/single_communicator.h"
#include "thread_world.h"

namespace scalelab {
namespace {

using testing::AdamWRef;
using testing::test_value;

// The unsharded reference: average the ranks' gradients, clip by global norm, AdamW everything.
struct Reference {
  std::vector<float> params;
  double norm = 0;
};
Reference reference(int world, std::int64_t n, int steps, float max_norm) {
  Reference ref;
  ref.params.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ref.params[static_cast<std::size_t>(i)] = test_value(99, i);
  AdamWRef opt;
  opt.init(0, n);
  std::vector<float> g(static_cast<std::size_t>(n));
  for (int s = 0; s < steps; ++s) {
    double sq = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += test_value(r, i, s);
      g[static_cast<std::size_t>(i)] = sum / static_cast<float>(world);
      sq += static_cast<double>(g[static_cast<std::size_t>(i)]) * g[static_cast<std::size_t>(i)];
    }
    ref.norm = std::sqrt(sq);
    opt.clip = static_cast<float>(std::min(1.0, max_norm / (ref.norm + 1e-6)));
    opt.step = s + 1;
    opt.update(ref.params.data(), g.data(), 0, n);
  }
  return ref;
}

TEST(ZeroOptimizer, ShardedUpdateEqualsUnshardedOverThreeRanks) {
  const int world_n = 3, steps = 3;
  const std::int64_t n = 10'007;
  const float max_norm = 5.0f;
  const Reference ref = reference(world_n, n, steps, max_norm);
  testing::ThreadWorld world(world_n);
  world.run([&](int r, Communicator& c) {
    std::vector<float> params(static_cast<std::size_t>(n)), grads(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) params[static_cast<std::size_t>(i)] = test_value(99, i);
    AdamWRef opt;
    ZeroOptimizer zero(c, params.data(), grads.data(), n, [&](std::int64_t b, std::int64_t e) {
      opt.update(params.data(), grads.data(), b, e);
    });
    opt.init(zero.shard_begin(), zero.shard_end());  // states for the shard only
    EXPECT_LT(opt.m.size(), static_cast<std::size_t>(n / 2));
    EXPECT_EQ(zero.shard_counts(), even_counts(n, world_n, 16));
    for (int s = 0; s < steps; ++s) {
      for (std::int64_t i = 0; i < n; ++i) grads[static_cast<std::size_t>(i)] = test_value(r, i, s);
      const double norm = zero.reduce_gradients();
      opt.clip = static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
      opt.step = s + 1;
      zero.update_and_gather();
      if (s == steps - 1) {
        EXPECT_NEAR(norm, ref.norm, 1e-9 * n + 1e-6);
      }
    }
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(params[static_cast<std::size_t>(i)], ref.params[static_cast<std::size_t>(i)], 2e-6f) << "element " << i;
    EXPECT_EQ(zero.stats().steps, steps);
  });
}

TEST(DataParallel, DdpAndZeroGiveTheSameParameters) {
  const int world_n = 2, steps = 2;
  const std::int64_t n = 3001;
  const Reference ref = reference(world_n, n, steps, 1.0f);
  // average = false is the trainer's way: each rank's gradient arrives already divided by the
  // world size (its backward seeded with 1/N) and the collectives only sum.
  for (const auto& case_ : {std::pair{0, true}, std::pair{1, true}, std::pair{0, false}, std::pair{1, false}}) {
    // Plain variables, not structured bindings: clang before 16 cannot capture those in a lambda.
    const int stage = case_.first;
    const bool average = case_.second;
    testing::ThreadWorld world(world_n);
    world.run([&](int r, Communicator& c) {
      std::vector<float> params(static_cast<std::size_t>(n)), grads(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) params[static_cast<std::size_t>(i)] = test_value(99, i);
      AdamWRef opt;
      DataParallelOptions o;
      o.zero_stage = stage;
      o.average = average;
      o.ddp.bucket_mb = 0.004;
      o.ddp.first_bucket_mb = 0.001;
      DataParallel dp(c, params.data(), grads.data(), n, o,
                      [&](std::int64_t b, std::int64_t e) { opt.update(params.data(), grads.data(), b, e); });
      opt.init(dp.optimizer_begin(), dp.optimizer_end());
      for (int s = 0; s < steps; ++s) {
        // Two micro-steps of accumulation: half the gradient each.
        std::fill(grads.begin(), grads.end(), 0.0f);
        for (int m = 0; m < 2; ++m) {
          dp.begin_micro_step(m == 1);
          for (std::int64_t l = 3; l >= 0; --l) {
            const std::int64_t b = n * l / 4, e = n * (l + 1) / 4;
            const float seed = average ? 0.5f : 0.5f / static_cast<float>(world_n);
            for (std::int64_t i = b; i < e; ++i) grads[static_cast<std::size_t>(i)] += seed * test_value(r, i, s);
            dp.mark_ready(b, e);
          }
        }
        const double norm = dp.end_backward();
        opt.clip = static_cast<float>(std::min(1.0, 1.0 / (norm + 1e-6)));
        opt.step = s + 1;
        dp.optimizer_step();
      }
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(params[static_cast<std::size_t>(i)], ref.params[static_cast<std::size_t>(i)], 2e-6f)
            << "zero " << stage << (average ? " averaging" : " summing") << " element " << i;
      const nlohmann::json s = dp.summary();
      EXPECT_EQ(s["zero"], stage);
      EXPECT_EQ(s["world_size"], world_n);
      EXPECT_EQ(s["synced_steps"], steps);
    });
  }
}

TEST(DataParallel, RejectsUnknownZeroStageAndMisorderedCalls) {
  SingleCommunicator c;
  std::vector<float> p(8), g(8);
  DataParallelOptions o;
  o.zero_stage = 2;
  EXPECT_THROW(DataParallel(c, p.data(), g.data(), 8, o, [](std::int64_t, std::int64_t) {}), InvalidInput);
  o.zero_stage = 0;
  DataParallel dp(c, p.data(), g.data(), 8, o, [](std::int64_t, std::int64_t) {});
  dp.begin_micro_step(false);
  EXPECT_THROW(dp.end_backward(), RuntimeError);
  dp.begin_micro_step(true);
  EXPECT_THROW(dp.optimizer_step(), RuntimeError);
}

}  // namespace
}  // namespace scalelab
