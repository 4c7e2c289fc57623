#pragma once
// Child processes whose output telemetry reads (nvidia-smi): spawned with posix_spawn (safe in a
// multi-threaded process, unlike fork), stdout and stderr into one close-on-exec pipe, stdin from
// /dev/null, and no other descriptor of the host program inherited (glibc >= 2.34).
// Callers reap only the pid they spawned (never waitpid(-1)), so a host program that waits for
// its own children (the lab's trial runner) is not disturbed, and vice versa.
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace scalelab {

struct SpawnedProcess {
  pid_t pid = -1;
  int out_fd = -1;  // read end: the child's stdout and stderr
};

// Starts argv[0] (a path, or a name looked up on PATH) with `argv`. Throws RuntimeError naming the
// program when it cannot be started.
SpawnedProcess spawn_reading_output(const std::vector<std::string>& argv);

struct CapturedOutput {
  std::string output;         // stdout and stderr, interleaved
  std::optional<int> status;  // exit status; nullopt when killed by a signal or timed out
  bool timed_out = false;
};

// Runs argv to completion (killing it after `timeout`) and returns its output.
CapturedOutput run_capturing_output(const std::vector<std::string>& argv,
                                    std::chrono::milliseconds timeout);

// Full path of `name` on PATH ("" when absent); a name with a '/' is returned as is when it is
// an executable file, "" otherwise.
std::string find_executable(const std::string& name);

// Waits up to `timeout` for the child to exit by itself and reaps it; its raw wait status, or
// nullopt when it is still running (or is not a child of this process).
std::optional<int> wait_for_exit(pid_t pid, std::chrono::milliseconds timeout);

// Sends SIGTERM, waits up to `grace` for the child to exit, then SIGKILL; reaps it. Returns the
// raw wait status (or -1 when it was already reaped).
int terminate_and_reap(pid_t pid, std::chrono::milliseconds grace);

}  // namespace scalelab
