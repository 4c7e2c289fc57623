// NcclCommunicator's logic with a fake NCCL (tests/distributed/fake_nccl.h): this machine has no GPU.
// What runs here: the unique-id bootstrap over the host communicator, device selection, ordering
// after the compute stream, the collectives' argument plumbing (native and grouped forms), polling
// of non-blocking calls, and the failure paths (timeout -> abort, peer failure, async error). The
// real libnccl path is compiled and linked (nccl_api_cuda.cpp) and runs only on a GPU machine.
#include "distributed/nccl_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>

#include "core/error.h"
#include "distributed/ddp.h"
#include "fake_nccl.h"
#include "thread_world.h"

namespace scalelab {
namespace {

using testing::FakeFabric;
using testing::FakeNccl;
using testing::ThreadWorld;

// Runs fn(rank, nccl communicator, fake api) on `n` thread ranks with `devices` fake GPUs each.
template <class F>
void with_nccl(int n, int devices, double timeout_s, F&& fn, FakeFabric* fabric_out = nullptr) {
  FakeFabric local;
  FakeFabric& fabric = fabric_out ? *fabric_out : local;
  ThreadWorld world(n, timeout_s);
  world.run([&](int r, Communicator& host) {
    auto api = std::make_unique<FakeNccl>(fabric, devices);
    FakeNccl* fake = api.get();
    auto nccl = NcclCommunicator::create(host, std::move(api));
    fn(r, *nccl, *fake);
  });
}

TEST(NcclCommunicator, BootstrapsOneUniqueIdFromRankZeroOverTheHostCommunicator) {
  FakeFabric fabric;
  std::vector<int> devices(3), init_ranks(3);
  std::vector<std::string> ids(3);
  with_nccl(3, 2, 10, [&](int r, NcclCommunicator& c, FakeNccl& api) {
    EXPECT_TRUE(c.device_memory());
    EXPECT_STREQ(c.backend(), "nccl");
    devices[static_cast<std::size_t>(r)] = api.device_set;
    init_ranks[static_cast<std::size_t>(r)] = api.init_rank;
    ids[static_cast<std::size_t>(r)] = std::string(api.init_id.data());
    EXPECT_EQ(api.init_world, 3);
    EXPECT_EQ(std::count(api.calls.begin(), api.calls.end(), "get_unique_id"), r == 0 ? 1 : 0);
  }, &fabric);
  EXPECT_EQ(fabric.unique_ids_made, 1);
  EXPECT_EQ(devices, (std::vector<int>{0, 1, 0}));  // local rank % device count
  EXPECT_EQ(init_ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ids[0], "fake-id-1");
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
}

TEST(NcclCommunicator, CollectivesRunOnTheCommStreamAfterTheComputeStream) {
  with_nccl(2, 1, 10, [](int r, NcclCommunicator& c, FakeNccl& api) {
    std::vector<float> v{1.0f + static_cast<float>(r), 10.0f * static_cast<float>(r)};
    api.calls.clear();
    c.all_reduce(v.data(), 2, CommDType::kF32, ReduceOp::kAvg);
    EXPECT_EQ(v, (std::vector<float>{1.5f, 5.0f}));
    // Ready event on the compute stream, comm stream waits on it, then the collective between
    // the start and done events of the comm stream.
    EXPECT_EQ(api.calls, (std::vector<std::string>{"record compute", "wait comm<-compute", "record comm",
                                                   "all_reduce", "record comm"}));
  });
}

TEST(NcclCommunicator, EvenAndUnevenGatherAndScatter) {
  with_nccl(2, 1, 10, [](int r, NcclCommunicator& c, FakeNccl& api) {
    // Even: native all_gather / reduce_scatter.
    std::vector<float> g{0, 0, 0, 0};
    g[static_cast<std::size_t>(2 * r)] = 1.0f + static_cast<float>(r);
    g[static_cast<std::size_t>(2 * r + 1)] = 2.0f + static_cast<float>(r);
    const std::vector<std::int64_t> even{2, 2};
    c.all_gather(g.data(), even, CommDType::kF32);
    EXPECT_EQ(g, (std::vector<float>{1, 2, 2, 3}));
    std::vector<float> send{1, 2, 3, 4}, recv(2);
    for (float& x : send) x *= static_cast<float>(r + 1);
    c.reduce_scatter(send.data(), recv.data(), even, CommDType::kF32, ReduceOp::kSum);
    EXPECT_EQ(recv, r == 0 ? (std::vector<float>{3, 6}) : (std::vector<float>{9, 12}));
    EXPECT_EQ(std::count(api.calls.begin(), api.calls.end(), "group_start"), 0);

    // Uneven: a group of broadcasts / reductions.
    const std::vector<std::int64_t> uneven{3, 1};
    std::vector<float> u(4, -1.0f);
    if (r == 0) u = {5, 6, 7, -1};
    else u[3] = 8;
    c.all_gather(u.data(), uneven, CommDType::kF32);
    EXPECT_EQ(u, (std::vector<float>{5, 6, 7, 8}));
    std::vector<float> s2{1, 1, 1, 1}, r2(static_cast<std::size_t>(uneven[static_cast<std::size_t>(r)]));
    c.reduce_scatter(s2.data(), r2.data(), uneven, CommDType::kF32, ReduceOp::kAvg);
    for (float x : r2) EXPECT_EQ(x, 1.0f);
    EXPECT_EQ(std::count(api.calls.begin(), api.calls.end(), "group_start"), 2);
    EXPECT_EQ(std::count(api.calls.begin(), api.calls.end(), "broadcast"), 2);
    EXPECT_EQ(std::count(api.calls.begin(), api.calls.end(), "reduce"), 2);
    c.barrier();
  });
}

TEST(NcclCommunicator, DdpReducerOverDeviceMemory) {
  with_nccl(2, 2, 10, [](int r, NcclCommunicator& c, FakeNccl&) {
    const std::int64_t n = 70'000;
    std::vector<float> g(static_cast<std::size_t>(n), static_cast<float>(2 * r + 1));
    GradReducer red(c, g.data(), n, DdpOptions{0.1, 0.05, true});
    red.begin_step(true);
    for (std::int64_t l = 6; l >= 0; --l) red.mark_ready(n * l / 7, n * (l + 1) / 7);
    red.finish();
    EXPECT_EQ(g[0], 2.0f);
    EXPECT_EQ(g[static_cast<std::size_t>(n - 1)], 2.0f);
    EXPECT_EQ(red.last_step().launched_early, static_cast<std::int64_t>(red.buckets().size()));
  });
}

TEST(NcclCommunicator, TimeoutAbortsAndSaysSo) {
  FakeFabric fabric;
  fabric.drop_collectives_of_rank = 1;  // rank 1 "hangs": its collectives never reach the fabric
  std::vector<std::string> errors(2);
  std::vector<int> aborted(2);
  with_nccl(2, 1, 0.3, [&](int r, NcclCommunicator& c, FakeNccl& api) {
    float x = 1;
    try {
      c.all_reduce(&x, 1, CommDType::kF32, ReduceOp::kSum);
    } catch (const RuntimeError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
    aborted[static_cast<std::size_t>(r)] = api.aborted;
    EXPECT_THROW(c.barrier(), RuntimeError);  // the communicator stays failed
  }, &fabric);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("did not complete within 0.3 s"), std::string::npos)
        << errors[static_cast<std::size_t>(r)];
    EXPECT_EQ(aborted[static_cast<std::size_t>(r)], 1);
  }
}

TEST(NcclCommunicator, PeerFailureOverTheHostChannelNamesTheRank) {
  std::string error;
  // Both communicators exist before rank 1 fails (else rank 0's init may see the failure first:
  // a race the slower sanitizer build exposed).
  std::barrier sync(2);
  with_nccl(2, 1, 30, [&](int r, NcclCommunicator& c, FakeNccl& api) {
    sync.arrive_and_wait();
    if (r == 1) {
      c.notify_failure("out of memory in layer 3");
      return;
    }
    float x = 1;
    try {
      c.all_reduce(&x, 1, CommDType::kF32, ReduceOp::kSum);
      ADD_FAILURE() << "all_reduce completed without rank 1";
    } catch (const RuntimeError& e) {
      error = e.what();
    }
    EXPECT_EQ(api.aborted, 1);
  });
  EXPECT_NE(error.find("rank 1 failed: out of memory in layer 3"), std::string::npos) << error;
}

TEST(NcclCommunicator, AsyncErrorFailsTheCollective) {
  FakeFabric fabric;
  std::vector<std::string> errors(2);
  std::barrier sync(2);
  with_nccl(2, 1, 30, [&](int r, NcclCommunicator& c, FakeNccl& api) {
    c.barrier();
    sync.arrive_and_wait();  // both saw the barrier complete before the error appears
    if (r == 0) {
      std::lock_guard<std::mutex> lk(fabric.mu);
      fabric.async_error = "remote process exited";
    }
    sync.arrive_and_wait();
    float x = 1;
    try {
      c.all_reduce(&x, 1, CommDType::kF32, ReduceOp::kSum);
    } catch (const RuntimeError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
    EXPECT_EQ(api.aborted, 1);
  }, &fabric);
  for (const std::string& e : errors) EXPECT_NE(e.find("remote process exited"), std::string::npos) << e;
}

TEST(NcclCommunicator, NoDeviceIsAClearError) {
  ThreadWorld world(1);
  FakeFabric fabric;
  try {
    NcclCommunicator::create(world.comm(0), std::make_unique<FakeNccl>(fabric, 0));
    ADD_FAILURE() << "expected an error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("sees no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(NcclApi, RealApiIsLinkedOrSaysItIsMissing) {
  if (!cuda_nccl_available()) {
    try {
      make_cuda_nccl_api();
      ADD_FAILURE() << "expected 'built without NCCL'";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
    }
    return;
  }
  auto api = make_cuda_nccl_api();
  EXPECT_EQ(api->version().rfind("nccl ", 0), 0u) << api->version();
  // No GPU here: cudaGetDeviceCount fails, and the error says which call and what to check.
  try {
    const int n = api->device_count();
    EXPECT_GE(n, 0);
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("[nccl] cudaGetDeviceCount failed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace scalelab
