// Whole jobs under mpirun, launched as child processes with a deadline: a rank that raises, dies
// or stalls must end the job within a bound with a message naming it, and a healthy job must end
// cleanly. (The programs are in tests/distributed/mpi/; the launch is by tests/distributed/CMakeLists.txt.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "distributed/dist_context.h"
#include "distributed/mpi_communicator.h"
#include "core/subprocess.h"

namespace scalelab {
namespace {

#ifdef SCALELAB_MPIRUN

std::vector<std::string> mpirun(int np, std::vector<std::string> program) {
  std::vector<std::string> argv;
  std::stringstream ss(SCALELAB_MPIRUN);
  for (std::string tok; std::getline(ss, tok, '|');) argv.push_back(tok);
  argv.push_back("-np");
  argv.push_back(std::to_string(np));
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

// The whole job must end within this bound (deadline of the child process, not a timing
// assertion): the failure handling, not a timeout of the test, must end it.
constexpr double kJobBound = 60;

SubprocessResult run_fault(const std::string& mode, const std::string& comm_timeout) {
  SubprocessSpec o;
  o.argv = mpirun(2, {SCALELAB_DIST_FAULT_WORKER, "--mode", mode, "--comm-timeout", comm_timeout});
  o.timeout_s = kJobBound;
  o.env = {{"OMP_NUM_THREADS", "1"}};
  return run_subprocess(o);
}

bool has(const std::string& out, const std::string& needle) { return out.find(needle) != std::string::npos; }

TEST(MpiJob, HealthyJobEndsCleanly) {
  const SubprocessResult r = run_fault("ok", "60");
  EXPECT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  EXPECT_TRUE(has(r.output, "rank 0: ok")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1: ok")) << r.output;
}

TEST(MpiJob, RankThatRaisesStopsTheOthersWithItsName) {
  // The comm timeout (300 s) is far beyond the bound: only the failure notice can end it in time.
  const SubprocessResult r = run_fault("throw", "300");
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has(r.output, "rank 1: error: injected failure: data file unreadable")) << r.output;
  // Rank 0 was waiting for a bucket and says who failed and why.
  EXPECT_TRUE(has(r.output, "rank 0: error: [dist] rank 1 failed: injected failure: data file unreadable")) << r.output;
}

TEST(MpiJob, RankThatExitsAbruptlyEndsTheJob) {
  const SubprocessResult r = run_fault("exit", "300");
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_FALSE(r.ok());
  // The rank exited without telling anyone; mpirun names it as process [[job,1],1]:
  // "The first process to do so was: Process name: [[8007,1],1] Exit code: 3".
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(Process name: \[\[[0-9]+,[0-9]+\],1\]\s+Exit code:\s+3)")))
      << r.output;
  EXPECT_FALSE(has(r.output, "rank 1: ok")) << r.output;
}

TEST(MpiJob, RankThatIsKilledEndsTheJob) {
  const SubprocessResult r = run_fault("kill", "300");
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has(r.output, "rank 1")) << r.output;
  EXPECT_TRUE(has(r.output, "signal 9")) << r.output;
}

TEST(MpiJob, StalledRankIsNamedWhenTheTimeoutExpires) {
  const SubprocessResult r = run_fault("stall", "3");
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has(r.output, "rank 0: error: [dist] rank 0: all_reduce")) << r.output;
  EXPECT_TRUE(has(r.output, "did not complete within")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1 has started only")) << r.output;
}

TEST(MpiJob, RanksFindThemselvesInTheLauncherEnvironment) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("scalelab_rank_result_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  SubprocessSpec o;
  o.timeout_s = kJobBound;
  // Each rank writes its own file: the path is expanded per rank by a shell.
  o.argv = mpirun(2, {"sh", "-c", std::string("exec ") + SCALELAB_DIST_RANK_RESULT + " --json " + dir.string() +
                                      "/rank-$OMPI_COMM_WORLD_RANK.json"});
  const SubprocessResult r = run_subprocess(o);
  ASSERT_TRUE(r.ok()) << r.describe() << "\n" << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("rank-" + std::to_string(rank) + ".json"));
    ASSERT_TRUE(in) << "no result from rank " << rank;
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["rank"], rank);
    EXPECT_EQ(j["world_size"], 2);
    EXPECT_EQ(j["launcher"], "openmpi");
    EXPECT_EQ(j["backend"], "mpi");
    EXPECT_EQ(j["sum_of_rank_plus_one"], 3.0);
  }
  std::filesystem::remove_all(dir);
}

#else

TEST(MpiJob, NotBuiltWithMpiSaysSo) {
  EXPECT_FALSE(MpiCommunicator::available());
  LaunchEnv two;
  two.launcher = Launcher::kOpenMpi;
  two.world_size = 2;
  try {
    make_dist_context(CommBackend::kAuto, false, CommOptions{}, two);
    ADD_FAILURE() << "expected 'built without MPI'";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("built without MPI"), std::string::npos) << e.what();
  }
  // One process needs no MPI.
  DistContext one = make_dist_context(CommBackend::kAuto, false, CommOptions{}, LaunchEnv{});
  EXPECT_STREQ(one.host().backend(), "single");
}

#endif

}  // namespace
}  // namespace scalelab
