#include "distributed/dist_context.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace scalelab {
namespace {

void expect_invalid(CommBackend b, bool cuda, const LaunchEnv& env, const std::string& needle) {
  try {
    make_dist_context(b, cuda, CommOptions{}, env);
    ADD_FAILURE() << "expected InvalidInput mentioning " << needle;
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DistContext, OneProcessIsSingle) {
  DistContext d = make_dist_context(CommBackend::kAuto, false, CommOptions{}, LaunchEnv{});
  EXPECT_STREQ(d.host().backend(), "single");
  EXPECT_EQ(&d.grads(), &d.host());
  EXPECT_FALSE(d.has_device_comm());
  EXPECT_EQ(d.world_size(), 1);
  // One GPU needs no NCCL either.
  DistContext g = make_dist_context(CommBackend::kAuto, true, CommOptions{}, LaunchEnv{});
  EXPECT_FALSE(g.has_device_comm());
}

TEST(DistContext, RefusesLaunchesItCannotServe) {
  LaunchEnv torchrun;
  torchrun.launcher = Launcher::kTorchrun;
  torchrun.world_size = 4;
  torchrun.rank = 1;
  expect_invalid(CommBackend::kAuto, false, torchrun, "mpirun -np 4 scalelab train");
  LaunchEnv two;
  two.launcher = Launcher::kOpenMpi;
  two.world_size = 2;
  expect_invalid(CommBackend::kSingle, false, two, "the launcher started 2 ranks");
  expect_invalid(CommBackend::kNccl, false, LaunchEnv{}, "needs --device cuda");
}

TEST(DistContext, ParsesBackendNames) {
  EXPECT_EQ(parse_comm_backend("auto"), CommBackend::kAuto);
  EXPECT_EQ(parse_comm_backend("mpi"), CommBackend::kMpi);
  EXPECT_EQ(parse_comm_backend("nccl"), CommBackend::kNccl);
  EXPECT_STREQ(comm_backend_name(CommBackend::kSingle), "single");
  EXPECT_THROW(parse_comm_backend("gloo"), InvalidInput);
}

}  // namespace
}  // namespace scalelab
