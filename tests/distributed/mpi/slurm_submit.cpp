// Submits a two-task MPI job to a real SLURM cluster through src/lab/slurm (sbatch --wait,
// srun --mpi=pmix) and checks the per-rank results it collects. Run by slurm_localhost_test.sh
// against the cluster of scripts/slurm-localhost.sh (SLURM_CONF in the environment).
// Usage: slurm_submit RANK_RESULT_BINARY WORK_DIR
#include <cstdio>
#include <string>

#include "core/error.h"
#include "lab/slurm.h"

using namespace scalelab;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: slurm_submit RANK_RESULT_BINARY WORK_DIR\n");
    return 2;
  }
  lab::SlurmJob job;
  job.job_name = "scalelab-test";
  job.nodes = 1;
  job.tasks_per_node = 2;
  job.time = "00:05:00";
  job.command = {argv[1]};
  job.work_dir = argv[2];
  job.env = {{"OMP_NUM_THREADS", "1"}};
  std::printf("--- sbatch script\n%s", lab::render_sbatch_script(job).c_str());
  lab::SlurmSubmitOptions options;
  options.timeout_s = 120;
  lab::SlurmJobResult r;
  try {
    r = lab::submit_slurm_job(job, options);
  } catch (const Error& e) {
    std::fprintf(stderr, "slurm_submit: error: %s\n", e.what());
    return 1;
  }
  std::printf("--- job %s: exit code %d%s\n--- job output (tail)\n%s", r.job_id.c_str(), r.exit_code,
              r.timed_out ? " (timed out)" : "", r.log_tail.c_str());
  int bad = 0;
  auto check = [&](bool cond, const std::string& what) {
    if (!cond) {
      std::fprintf(stderr, "FAILED: %s\n", what.c_str());
      ++bad;
    }
  };
  check(r.ok(), "job ok: " + r.describe());
  check(r.ranks.size() == 2, "two rank results");
  for (const auto& rank : r.ranks) {
    if (!rank.record) continue;
    const auto& j = *rank.record;
    std::printf("--- rank %d result: %s\n", rank.rank, j.dump().c_str());
    check(j.value("rank", -1) == rank.rank, "rank field of rank " + std::to_string(rank.rank));
    check(j.value("world_size", -1) == 2, "world size 2 seen by rank " + std::to_string(rank.rank));
    check(j.value("launcher", std::string()) == "slurm", "launcher detected as slurm by rank " + std::to_string(rank.rank));
    check(j.value("backend", std::string()) == "mpi", "MPI communicator on rank " + std::to_string(rank.rank));
    check(j.value("sum_of_rank_plus_one", 0.0) == 3.0, "all-reduce over srun --mpi=pmix on rank " + std::to_string(rank.rank));
  }
  std::printf(bad ? "--- %d check(s) failed\n" : "--- all checks passed\n", bad);
  return bad ? 1 : 0;
}
