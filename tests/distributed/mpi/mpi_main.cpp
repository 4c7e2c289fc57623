// GoogleTest main for the tests that run under `mpirun -np 2` (registered in
// tests/distributed/CMakeLists.txt). Every rank runs every test; rank 0 prints the usual output, the
// other ranks print only their failures (prefixed with the rank). The job fails if any rank fails.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "mpi_env.h"

namespace scalelab::testing {
namespace {
std::unique_ptr<MpiCommunicator> g_world;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

MpiCommunicator& mpi_world() { return *g_world; }
}  // namespace scalelab::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  scalelab::CommOptions options;
  options.timeout_s = 60;  // a test that desynchronizes the ranks fails instead of hanging
  scalelab::testing::g_world = scalelab::MpiCommunicator::create(options);
  const int rank = scalelab::testing::g_world->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new scalelab::testing::RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  // Every rank's verdict decides the job's: a failure on any rank fails every rank.
  const int worst = scalelab::testing::g_world->all_reduce_value<std::int32_t>(rc, scalelab::ReduceOp::kMax);
  scalelab::testing::g_world.reset();  // MPI_Finalize
  return worst;
}
