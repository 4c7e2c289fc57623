#include "telemetry/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace scalelab {

std::string find_executable(const std::string& name) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    // Built by append: GCC 12 warns falsely (-Wrestrict) on `dir + "/" + name` here.
    std::string candidate = end > start ? dirs.substr(start, end - start) : std::string(".");
    candidate.append(1, '/').append(name);
    if (executable(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

SpawnedProcess spawn_reading_output(const std::vector<std::string>& argv) {
  SCALELAB_CHECK(!argv.empty(), "[telemetry] spawn: empty command — this is a bug");
  const std::string exe = find_executable(argv[0]);
  if (exe.empty())
    throw RuntimeError("[telemetry] cannot start " + argv[0] + ": not found or not executable");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw RuntimeError(std::string("[telemetry] pipe2 failed: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // The host program's other descriptors (say, the lab's pipe from a trial's stdout, opened
  // without O_CLOEXEC) must not stay open in nvidia-smi: the host would never see their EOF.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw RuntimeError("[telemetry] cannot start " + exe + ": " + std::strerror(rc));
  }
  return {pid, fds[0]};
}

std::optional<int> wait_for_exit(pid_t pid, std::chrono::milliseconds timeout) {
  if (pid <= 0) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return std::nullopt;  // not our child, or already reaped
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int terminate_and_reap(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return -1;
  if (auto s = wait_for_exit(pid, std::chrono::milliseconds(0))) return *s;
  if (::kill(pid, SIGTERM) != 0) return -1;
  if (auto s = wait_for_exit(pid, grace)) return *s;
  ::kill(pid, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  return r == pid ? status : -1;
}

CapturedOutput run_capturing_output(const std::vector<std::string>& argv,
                                    std::chrono::milliseconds timeout) {
  SpawnedProcess p = spawn_reading_output(argv);
  CapturedOutput out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      out.timed_out = true;
      break;
    }
    pollfd pfd{p.out_fd, POLLIN, 0};
    const int pr = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      out.timed_out = pr == 0;
      break;
    }
    const ssize_t n = ::read(p.out_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child closed its output
    out.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(p.out_fd);
  // After EOF the child is exiting: give it a moment before signalling it.
  std::optional<int> status;
  if (!out.timed_out) status = wait_for_exit(p.pid, std::chrono::milliseconds(2000));
  if (!status) {
    terminate_and_reap(p.pid, std::chrono::milliseconds(200));
  } else if (WIFEXITED(*status)) {
    out.status = WEXITSTATUS(*status);
  }
  return out;
}

}  // namespace scalelab
