#pragma once
// Rank, world size and local rank from the launcher's environment variables:
//   OpenMPI mpirun   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//                    (and OMPI_COMM_WORLD_LOCAL_SIZE)
//   SLURM srun       SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID;
//                    only inside a job step (SLURM_STEP_ID set): a batch script itself is not a
//                    rank even though SLURM_PROCID=0 and SLURM_NTASKS are set there
//   torchrun         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// The innermost launcher wins: mpirun inside a SLURM allocation sets OMPI_* and is believed
// first, then SLURM, then torchrun. Nothing set: one process (rank 0 of 1).
#include <functional>
#include <optional>
#include <string>

namespace scalelab {

enum class Launcher { kNone, kOpenMpi, kSlurm, kTorchrun };
const char* launcher_name(Launcher l);  // "none", "openmpi", "slurm", "torchrun"

struct LaunchEnv {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // torchrun only
  int master_port = 0;      // torchrun only
  bool is_master() const { return rank == 0; }
};

// Looks a variable up; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup process_env();

// Throws InvalidInput naming the variable when a value is not an integer or is inconsistent
// (rank outside [0, world), local rank outside [0, local world), world < 1).
LaunchEnv detect_launch_env(const EnvLookup& env);
inline LaunchEnv detect_launch_env() { return detect_launch_env(process_env()); }

}  // namespace scalelab
