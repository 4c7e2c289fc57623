#include "distributed/launch_env.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace scalelab {
namespace {

EnvLookup fake(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchEnv, NothingSetIsOneProcess) {
  const LaunchEnv e = detect_launch_env(fake({{"HOME", "/root"}}));
  EXPECT_EQ(e.launcher, Launcher::kNone);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_TRUE(e.is_master());
}

TEST(LaunchEnv, OpenMpi) {
  const LaunchEnv e = detect_launch_env(fake({{"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "8"},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(e.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_FALSE(e.is_master());
}

TEST(LaunchEnv, SlurmStepPrefersStepTaskCount) {
  const LaunchEnv e = detect_launch_env(fake({{"SLURM_PROCID", "5"},
                                              {"SLURM_STEP_ID", "0"},
                                              {"SLURM_NTASKS", "16"},
                                              {"SLURM_STEP_NUM_TASKS", "6"},
                                              {"SLURM_LOCALID", "1"},
                                              {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}}));
  EXPECT_EQ(e.launcher, Launcher::kSlurm);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
}

TEST(LaunchEnv, SlurmFallsBackToNtasks) {
  const LaunchEnv e = detect_launch_env(
      fake({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}}));
  EXPECT_EQ(e.launcher, Launcher::kSlurm);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
}

TEST(LaunchEnv, SlurmBatchScriptIsNotARank) {
  // sbatch sets SLURM_PROCID=0 and SLURM_NTASKS for the batch script itself, outside any step.
  const LaunchEnv e = detect_launch_env(fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "7"}}));
  EXPECT_EQ(e.launcher, Launcher::kNone);
  EXPECT_EQ(e.world_size, 1);
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = detect_launch_env(fake({{"RANK", "2"},
                                              {"WORLD_SIZE", "4"},
                                              {"LOCAL_RANK", "0"},
                                              {"LOCAL_WORLD_SIZE", "2"},
                                              {"MASTER_ADDR", "node17"},
                                              {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(e.launcher, Launcher::kTorchrun);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node17");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, MpirunInsideSlurmAllocationBelievesMpirun) {
  const LaunchEnv e = detect_launch_env(fake({{"SLURM_PROCID", "0"},
                                              {"SLURM_STEP_ID", "0"},
                                              {"SLURM_NTASKS", "1"},
                                              {"OMPI_COMM_WORLD_RANK", "1"},
                                              {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(e.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
}

void expect_invalid(const std::map<std::string, std::string>& vars, const std::string& needle) {
  try {
    detect_launch_env(fake(vars));
    ADD_FAILURE() << "expected InvalidInput mentioning " << needle;
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, BadValuesAreInvalidInputNamingTheVariable) {
  expect_invalid({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK='x1'");
  expect_invalid({{"RANK", "1"}, {"WORLD_SIZE", "-2"}}, "WORLD_SIZE='-2'");
  expect_invalid({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "rank 2 of a world of 2");
  expect_invalid({{"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_RANK is not set");
  expect_invalid({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}}, "local rank 3");
}

}  // namespace
}  // namespace scalelab
