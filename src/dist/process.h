#pragma once
// Runs a command (mpirun, sbatch, a test worker) as a child process with a deadline, capturing its
// output: what the launchers in src/dist and src/lab/slurm need. The child gets its own process
// group, so on timeout the whole tree (mpirun and its ranks) is ended: SIGTERM, then SIGKILL.
#include <string>
#include <utility>
#include <vector>

namespace scalelab {

struct ProcessOptions {
  double timeout_s = 0;  // 0: no deadline
  std::vector<std::pair<std::string, std::string>> env;  // set (or overridden) in the child
  std::vector<std::string> unset_env;                     // removed from the child's environment
  std::string cwd;                                        // empty: inherit
  std::size_t max_output = 1 << 20;                       // keep the last this many bytes
};

struct ProcessResult {
  int exit_code = -1;    // when it exited normally
  int term_signal = 0;   // when a signal ended it
  bool timed_out = false;
  double seconds = 0;
  std::string output;    // stdout and stderr, interleaved as written
  bool ok() const { return !timed_out && term_signal == 0 && exit_code == 0; }
  // "exit code 3", "killed by signal 9", "timed out after 30 s".
  std::string describe() const;
};

// Throws RuntimeError when the command cannot be started (not found, fork failed).
ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

}  // namespace scalelab
