#pragma once
// Running a data-parallel job on a SLURM cluster: the sbatch script (nodes, tasks per node, GPUs,
// time, partition; one task per rank started by `srun --mpi=pmix`), its submission with
// `sbatch --wait`, and the collection of the per-rank results.
//
// Each task runs `command` with `<result_flag> <work_dir>/rank-<rank>.json` appended (for
// `scalelab train`: --json), the rank being the task's SLURM_PROCID, so every rank writes its own
// run record and collect_rank_results() reads them back. `scalelab scale --dry-run` prints
// render_sbatch_script().
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::lab {

struct SlurmJob {
  std::string job_name = "scalelab";
  int nodes = 1;
  int tasks_per_node = 1;
  int gpus_per_node = 0;   // --gpus-per-node; 0: no GPUs requested
  int cpus_per_task = 0;   // --cpus-per-task; 0: the cluster's default
  std::string time = "01:00:00";  // --time (a SLURM duration)
  std::string partition;   // empty: the default partition
  std::string account;     // empty: the default account
  std::vector<std::string> extra_sbatch;  // more options, e.g. "--exclusive", "--qos=high"
  std::string mpi = "pmix";               // srun --mpi
  std::vector<std::string> command;       // argv of every task
  std::string result_flag = "--json";     // empty: append nothing (the command writes no result)
  std::string work_dir;                   // absolute: script, log and results go here
  std::vector<std::pair<std::string, std::string>> env;  // exported in the script

  int tasks() const { return nodes * tasks_per_node; }
  std::string script_path() const { return work_dir + "/job.sbatch"; }
  std::string rank_result_path(int rank) const { return work_dir + "/rank-" + std::to_string(rank) + ".json"; }
};

// Throws InvalidInput naming the field when the job cannot be expressed (non-positive counts, an
// option with spaces or quotes that #SBATCH cannot carry, an empty command, a relative work_dir).
void validate_slurm_job(const SlurmJob& job);

// The batch script. Arguments are single-quoted for the shell, so any command line survives.
std::string render_sbatch_script(const SlurmJob& job);

struct SlurmSubmitOptions {
  double timeout_s = 0;     // 0: none; otherwise the job is cancelled (scancel) when it expires
  std::vector<std::pair<std::string, std::string>> env;  // for sbatch/scancel (e.g. SLURM_CONF)
  std::string sbatch = "sbatch";
  std::string scancel = "scancel";
};

struct SlurmRankResult {
  int rank = 0;
  std::optional<nlohmann::json> record;  // the rank's JSON result, if it wrote one
  std::string error;                     // why there is none (missing, unreadable, not JSON)
};

struct SlurmJobResult {
  std::string job_id;
  int exit_code = -1;       // the job's (sbatch --wait returns it)
  bool timed_out = false;
  std::string sbatch_output;
  std::string log_tail;     // end of the job's output file
  std::vector<SlurmRankResult> ranks;
  // The job exited 0 and every rank wrote a result whose "status" (if present) is "ok".
  bool ok() const;
  // One line: why the job is not ok, naming the ranks.
  std::string describe() const;
};

// Reads <dir>/rank-<r>.json for r in [0, tasks).
std::vector<SlurmRankResult> collect_rank_results(const SlurmJob& job);

// Writes the script into job.work_dir (created), submits it with `sbatch --parsable --wait`,
// waits (cancelling the job on timeout), and collects the results. Throws RuntimeError when
// sbatch cannot be run or rejects the job (its message included), InvalidInput for a bad job.
SlurmJobResult submit_slurm_job(const SlurmJob& job, const SlurmSubmitOptions& options = {});

}  // namespace scalelab::lab
