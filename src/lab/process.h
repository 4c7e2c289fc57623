#pragma once
// Runs one child process the way a trial needs it: its own process group (so a timeout or Ctrl-C
// kills everything it started, e.g. torchrun's workers), stdin from /dev/null, stdout and stderr
// into one log file, an optional timeout, and cooperative cancellation.
//
// fork/exec rather than posix_spawn because the child also asks the kernel to kill it when the
// runner dies (PR_SET_PDEATHSIG), which posix_spawn cannot express; everything the child does
// between fork and exec is async-signal-safe (all strings are prepared before the fork).
#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace scalelab::lab {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] without a '/' is looked up on PATH
  std::string log_path;           // created (truncated); receives stdout and stderr
  std::string log_header;         // written to the log before the child starts (may be empty)
  std::vector<std::pair<std::string, std::string>> env;  // added to / overriding the environment
  std::string cwd;                // empty: the runner's
  double timeout_s = 0;           // 0: no timeout
  double kill_grace_s = 5;        // after SIGTERM to the group, wait this long before SIGKILL
  // Called once the child runs (exec succeeded) with its pid, which is also its process-group id
  // (e.g. to start sampling its process tree).
  std::function<void(int pid)> on_start;
};

struct ProcessResult {
  bool started = false;
  std::string start_error;  // why it did not start (not found, not executable, log not writable)
  bool exited = false;      // ended by exit(); otherwise by a signal
  int exit_code = -1;       // when exited
  int signal = 0;           // when killed by a signal
  bool timed_out = false;   // the timeout expired and the group was killed
  bool cancelled = false;   // *cancel became true and the group was killed
  double wall_s = 0;
};

// Runs the process to completion. `cancel` (may be null) is polled; when it becomes true the
// process group is terminated like on a timeout. `tick` (may be empty) is called about twice a
// second while the child runs (progress display). Never throws for a child's failure; throws
// RuntimeError only when the runner itself cannot fork.
ProcessResult run_process(const ProcessSpec& spec, const std::atomic<bool>* cancel = nullptr,
                          const std::function<void()>& tick = {});

// "exit code 3", "killed by signal 9 (Killed)", "timed out after 2.0 s", ...
std::string describe_process_end(const ProcessResult& r, double timeout_s);

// Looks `name` up on PATH (names with a '/' are returned as they are when they exist).
// Returns "" when not found.
std::string find_executable(const std::string& name);

// The last `max_bytes` of a file (whole lines), "" when unreadable.
std::string read_file_tail(const std::string& path, std::size_t max_bytes);

}  // namespace scalelab::lab
