// The trainer's data-parallel side in one process: what it refuses, the ZeRO-1 memory plan, the
// per-rank thread count and the data-fault hook. (Runs over MPI: tests/distributed/train_mpi_test.cpp.)
#include "train/data_parallel_run.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"
#include "model/params.h"
#include "distributed/zero.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace scalelab {
namespace {

std::map<std::string, std::size_t> plan_items(const PlanInput& in) {
  std::map<std::string, std::size_t> m;
  for (const PlanItem& it : plan_memory(in).items) m[it.name] = it.bytes;
  return m;
}

TEST(DataParallelPlan, ZeroOneShardsTheOptimizerStates) {
  TrainOptions o;
  o.model = "llama-tiny";
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.threads = 1;
  PlanInput in = make_plan_input(o);
  const std::int64_t P = ParamLayout::build(in.config).total_numel();
  const auto single = plan_items(in);
  EXPECT_EQ(optimizer_state_numel(in, P), P);

  in.world_size = 4;
  const auto ddp = plan_items(in);  // DDP keeps every state on every rank
  EXPECT_EQ(ddp.at("optimizer states"), single.at("optimizer states"));

  in.zero_stage = 1;
  const std::vector<std::int64_t> counts = ZeroOptimizer::shard_counts(P, 4);
  for (int r = 0; r < 4; ++r) {
    in.rank = r;
    EXPECT_EQ(optimizer_state_numel(in, P), counts[static_cast<std::size_t>(r)]);
  }
  in.rank = 0;
  const MemoryPlan zp = plan_memory(in);
  std::map<std::string, std::size_t> zero;
  for (const PlanItem& it : zp.items) zero[it.name] = it.bytes;
  const std::size_t shard_bytes = DeviceAllocator::round_size(static_cast<std::size_t>(counts[0]) * 4);
  EXPECT_EQ(zero.at("optimizer states"), 2 * shard_bytes);
  // The gradient buffer plus the shard's reduce-scatter output.
  EXPECT_EQ(zero.at("gradients"), single.at("gradients") + shard_bytes);
  // The total is reserved bytes in 2 MiB segments, which llama-tiny fits either way; the items
  // (what each part needs) show the saving.
  std::size_t zero_sum = 0, single_sum = 0;
  for (const auto& [name, bytes] : zero) zero_sum += bytes;
  for (const auto& [name, bytes] : single) single_sum += bytes;
  EXPECT_LT(zero_sum - zero.at("gradients"), single_sum - single.at("gradients"));
  EXPECT_LE(zp.total, plan_memory(make_plan_input(o)).total);
  EXPECT_EQ(zp.to_json()["world_size"], 4);
  EXPECT_EQ(zp.to_json()["zero_stage"], 1);
}

TEST(DataParallelRun, RefusesBf16GradientsWithAWayOut) {
  DistContext dist = make_dist_context(CommBackend::kAuto, false, CommOptions{}, LaunchEnv{});
  DistFlags flags;
  const PrecisionPlan bf16 = resolve_precision("bf16", "no", "auto");
  try {
    DataParallelRun dp(dist, flags, bf16, 1000);
    FAIL() << "bf16 gradients were accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--mixed-precision bf16"), std::string::npos) << e.what();
  }
  const PrecisionPlan mixed = resolve_precision("fp32", "bf16", "auto");
  flags.zero = 1;
  DataParallelRun ok(dist, flags, mixed, 1000);  // one rank: the whole buffer is its shard
  EXPECT_TRUE(ok.zero());
  EXPECT_EQ(ok.state_begin(), 0);
  EXPECT_EQ(ok.state_numel(), 1000);
  flags.zero = 2;
  EXPECT_THROW(DataParallelRun(dist, flags, mixed, 1000), InvalidInput);
}

TEST(DataParallelRun, ThreadsPerRank) {
  LaunchEnv env;
  EXPECT_EQ(threads_for_rank(3, env), 3);  // asked for: kept
  const int machine = static_cast<int>(std::thread::hardware_concurrency());
  env.local_world_size = 1;
  const int one = threads_for_rank(0, env);
  EXPECT_GE(one, 1);
  EXPECT_LE(one, machine);
  env.local_world_size = 4 * machine;  // more ranks than cores: at least one thread each
  EXPECT_EQ(threads_for_rank(0, env), one < machine ? one : 1);
}

TEST(DataParallelRun, InjectedDataFaultOnOneRank) {
  DataOptions d{"synthetic", 4, 1, 256, 1, 0, 2};
  ::setenv("SCALELAB_INJECT_DATA_FAULT", "1:1", 1);
  DeviceAllocator alloc(make_host_backend(), 1 << 20);
  Batch b = make_batch(1, 4, alloc);
  auto r0 = with_injected_data_fault(make_data_source(d), 0);
  r0->next(b);
  r0->next(b);  // rank 0 is not affected
  d.rank = 1;
  auto r1 = with_injected_data_fault(make_data_source(d), 1);
  r1->next(b);
  try {
    r1->next(b);
    FAIL() << "no injected failure";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("on rank 1"), std::string::npos) << e.what();
  }
  ::setenv("SCALELAB_INJECT_DATA_FAULT", "one", 1);
  EXPECT_THROW(with_injected_data_fault(make_data_source(d), 1), InvalidInput);
  ::unsetenv("SCALELAB_INJECT_DATA_FAULT");
  auto plain = with_injected_data_fault(make_data_source(d), 1);
  plain->next(b);
  plain->next(b);
}

}  // namespace
}  // namespace scalelab
