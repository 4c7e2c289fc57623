#pragma once
// Child processes: the one place scalelab starts, waits for and kills them (the lab's trials,
// mpirun and sbatch launches, nvidia-smi streams).
//
// A child is started with fork/exec: stdin from /dev/null; stdout and stderr together into a pipe
// the caller reads, or into a log file; no other descriptor of the host program (all are marked
// close-on-exec in the child, so a pipe the host reads elsewhere still sees its EOF); by default in
// a process group of its own (so a timeout or a cancel ends everything it started, e.g. mpirun's
// ranks or torchrun's workers) and killed by the kernel when the thread that started it dies
// (PR_SET_PDEATHSIG, which posix_spawn cannot express). Between fork and exec the child makes only
// async-signal-safe calls: everything is prepared before the fork. An exec failure comes back
// through a close-on-exec pipe, so "cannot start" is told apart from "started and failed".
// Only the pid that was started is ever waited for (never waitpid(-1)), so callers that wait for
// their own children are not disturbed, and vice versa.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace scalelab {

struct SubprocessSpec {
  std::vector<std::string> argv;  // argv[0] without a '/' is looked up on PATH
  std::vector<std::pair<std::string, std::string>> env;  // set (or overridden) in the child
  std::vector<std::string> unset_env;                     // removed from the child's environment
  std::string cwd;                                        // empty: inherit
  // Output: empty log_path: a pipe (Subprocess::output_fd(); run_subprocess keeps the last
  // max_output bytes in SubprocessResult::output). Otherwise the file is created (truncated),
  // log_header is written first, and the child's stdout and stderr are appended.
  std::string log_path;
  std::string log_header;
  std::size_t max_output = 1 << 20;
  // Its own process group: signals go to the whole group, and what is left of the group is
  // killed once the child has ended. false: the child stays in the host's group (Ctrl-C at the
  // terminal reaches it too) and only the child itself is signalled.
  bool own_process_group = true;
  // SIGKILL when the *thread* that started it exits (the kernel's rule). Leave it on for a child
  // waited for by the thread that started it (run_subprocess); turn it off for one that outlives
  // the call that started it (a stream read by another thread).
  bool die_with_parent = true;
  // run_subprocess only.
  double timeout_s = 0;     // 0: none
  double kill_grace_s = 5;  // after SIGTERM (timeout or cancel), this long before SIGKILL
  // With a log_path: the most bytes the log may grow to (0: no limit). A child whose log passes
  // it is ended as on a timeout (a runaway loop printing must not fill the disk).
  std::uint64_t max_log_bytes = 0;
  // Called once the child runs (exec succeeded) with its pid, which is its process-group id when
  // own_process_group (e.g. to sample its process tree).
  std::function<void(pid_t pid)> on_start;
};

// The command could not be started: not found, not executable, the log file not writable, the
// working directory missing. Other failures (fork, pipe) are RuntimeError.
class SubprocessStartError : public RuntimeError {
 public:
  explicit SubprocessStartError(const std::string& message) : RuntimeError(message) {}
};

// How a child ended, decoded from a raw wait status.
struct ExitStatus {
  bool exited = false;  // ended by exit(); otherwise by a signal
  int code = -1;        // when exited
  int signal = 0;       // when killed by a signal
  static ExitStatus from_wait_status(int status);
  // "exit code 3", "killed by signal 9 (Killed)".
  std::string describe() const;
};

// A started child. Movable, not copyable; the destructor kills (SIGKILL, the group when it has
// one) and reaps a child that is still there, and closes the output pipe.
class Subprocess {
 public:
  // Throws SubprocessStartError when the command cannot be started, RuntimeError when fork or a
  // pipe fails.
  static Subprocess start(const SubprocessSpec& spec);

  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool valid() const { return pid_ > 0; }
  // Read end of the output pipe (-1 with a log file, or after close_output()).
  int output_fd() const { return out_fd_; }
  void close_output();

  // Waits up to `timeout` for the child to end, without reaping it: while it is a zombie its pid
  // and process-group id cannot be reused, so signalling the group afterwards cannot hit a
  // stranger. True when it has ended (or is not there to wait for).
  bool wait_ended(std::chrono::milliseconds timeout);
  // Sends `sig` to the child (its group when it has one); nothing once it is reaped.
  void signal(int sig);
  // Reaps the child (waiting for it to end) and returns how it ended; the group's leftovers are
  // killed first. The same status on later calls.
  ExitStatus reap();
  bool reaped() const { return reaped_; }
  // Waits up to `timeout`; reaps and returns the status when it ended, nullopt otherwise.
  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout);
  // SIGTERM, up to `grace` for it to end, then SIGKILL; reaps.
  ExitStatus terminate(std::chrono::milliseconds grace);

 private:
  void release();  // what the destructor does

  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool group_ = false;
  bool reaped_ = false;
  ExitStatus status_;
};

struct SubprocessResult {
  bool started = false;
  std::string start_error;  // why it did not start
  ExitStatus status;        // when started
  bool timed_out = false;   // the timeout expired and the child (group) was killed
  bool cancelled = false;   // *cancel became true and the child (group) was killed
  bool log_overflow = false;  // its log passed max_log_bytes and the child (group) was killed
  std::uint64_t max_log_bytes = 0;  // the spec's, for describe()
  double wall_s = 0;
  double timeout_s = 0;     // the spec's, for describe()
  std::string output;       // stdout and stderr as written (the last max_output bytes); pipe mode

  bool exited() const { return started && status.exited; }
  int exit_code() const { return exited() ? status.code : -1; }
  int term_signal() const { return started && !status.exited ? status.signal : 0; }
  bool ok() const { return exited() && status.code == 0 && !timed_out && !cancelled && !log_overflow; }
  // "exit code 3", "killed by signal 9 (Killed)", "timed out after 2.0 s (its process group was
  // killed)", "cancelled (...)", "its log passed ...", "did not start: ...".
  std::string describe() const;
};

// Runs the child to completion. `cancel` (may be null) is polled; when it becomes true the child
// is ended as on a timeout. `tick` (may be empty) is called about twice a second while it runs.
// A command that cannot be started comes back with started == false (never thrown); throws
// RuntimeError only when the host itself cannot fork.
SubprocessResult run_subprocess(const SubprocessSpec& spec, const std::atomic<bool>* cancel = nullptr,
                                const std::function<void()>& tick = {});

// Full path of `name` on PATH ("" when absent); a name with a '/' is returned as it is when it is
// an executable file, "" otherwise.
std::string find_executable(const std::string& name);

}  // namespace scalelab
