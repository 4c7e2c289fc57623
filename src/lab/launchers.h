#pragma once
// Launchers of data-parallel trials (the scaling study, `scalelab scale`): the trial's parameter
// `ranks` says how many ranks run the native engine's `train` command.
//
//   MpirunLauncher  this machine: `mpirun -np N [--allow-run-as-root] [--oversubscribe]
//                   --bind-to core|none <engine> train ... --json <record>`, a child process of the
//                   runner (its process group is killed on timeout or Ctrl-C, ranks included).
//   SlurmLauncher   a cluster: an sbatch script (lab/slurm.h: nodes, tasks per node, GPUs per
//                   node, `srun --mpi=pmix <engine> train ... --json <record>`), submitted with
//                   `sbatch --parsable --wait`; on timeout or Ctrl-C the job is cancelled
//                   (scancel). The job's output is appended to the trial's log. Rank 0 writes
//                   the run record, so the log directory must be on a file system the nodes share.
// The parameters `ranks` and `launcher` are the launcher's; every other
// parameter becomes a train flag.
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "lab/executor.h"
#include "lab/slurm.h"

namespace scalelab::lab {

// Parameters a scaling trial has besides its train flags.
inline constexpr const char* kRanksParam = "ranks";
inline constexpr const char* kLauncherParam = "launcher";

// The trial's rank count (params["ranks"]); InvalidInput when missing or not a positive integer.
int trial_ranks(const ParamMap& params);
// The params without the launcher's own (what becomes train flags).
ParamMap train_params(const ParamMap& params);

struct MpirunOptions {
  std::string mpirun = "mpirun";
  std::vector<std::string> extra_args;  // --mpirun-arg, inserted before -np
  int cores = 0;                        // this machine's cores (0: detect)
  int threads_per_rank = 1;             // for the binding choice: 1 -> --bind-to core
  bool as_root = false;                 // add --allow-run-as-root (the runner is root)
};

class MpirunLauncher final : public TrialLauncher {
 public:
  explicit MpirunLauncher(MpirunOptions options);
  Launch launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                const TrialContext& ctx) const override;
  SubprocessResult run(const SubprocessSpec& spec, const ParamMap& params, const TrialContext& ctx,
                       const std::atomic<bool>* cancel, const std::function<void()>& tick) const override;

 private:
  MpirunOptions options_;
};

struct SlurmOptions {
  int tasks_per_node = 0;  // 0: all ranks on one node (up to --gpus-per-node when GPUs are asked)
  int gpus_per_node = 0;
  int cpus_per_task = 0;
  std::string time = "01:00:00";
  std::string partition, account, mpi = "pmix";
  std::vector<std::string> extra_sbatch;  // --sbatch-arg
  std::vector<std::pair<std::string, std::string>> env;  // exported in the script
  std::string sbatch = "sbatch", scancel = "scancel";
};

class SlurmLauncher final : public TrialLauncher {
 public:
  explicit SlurmLauncher(SlurmOptions options);
  // The job of one trial: its shape from the rank count, the engine command, the directory
  // <trial dir>/<key>.slurm. InvalidInput when the ranks do not fill whole nodes.
  SlurmJob job(const Workload& workload, const std::string& engine, const ParamMap& params,
               const TrialContext& ctx) const;
  // Also writes the job's script (job().script_path()): the command is `sbatch --parsable --wait
  // <script>`.
  Launch launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                const TrialContext& ctx) const override;
  // Runs sbatch (its output into the trial log), cancels the job when the trial is stopped, and
  // appends the job's output to the log.
  SubprocessResult run(const SubprocessSpec& spec, const ParamMap& params, const TrialContext& ctx,
                       const std::atomic<bool>* cancel, const std::function<void()>& tick) const override;

 private:
  SlurmOptions options_;
};

}  // namespace scalelab::lab
