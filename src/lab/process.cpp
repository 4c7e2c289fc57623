#include "lab/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace scalelab::lab {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Waits for `pid` to end or `deadline_s` (seconds since t0, <0: forever) to pass. Returns true
// when it has ended. The child is left a zombie (WNOWAIT): while it is, its pid and process-group
// id cannot be reused, so killing the group afterwards cannot hit a stranger.
bool wait_until(pid_t pid, Clock::time_point t0, double deadline_s, const std::atomic<bool>* cancel,
                const std::function<void()>& tick, bool* cancelled) {
  auto last_tick = Clock::now();
  int sleep_ms = 2;
  for (;;) {
    siginfo_t info{};
    int r = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (r == 0 && info.si_pid == pid) return true;
    if (r < 0 && errno != EINTR) return true;  // ECHILD: nothing left to wait for
    if (cancel && cancel->load() && cancelled && !*cancelled) {
      *cancelled = true;
      return false;
    }
    if (deadline_s >= 0 && seconds_since(t0) >= deadline_s) return false;
    if (tick && seconds_since(last_tick) >= 0.5) {
      tick();
      last_tick = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
}

}  // namespace

std::string find_executable(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= p.size()) {
    auto end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string candidate = end > start ? p.substr(start, end - start) : std::string(1, '.');
    candidate += '/';
    candidate += name;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

std::string read_file_tail(const std::string& path, std::size_t max_bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  f.seekg(start);
  std::string text(static_cast<std::size_t>(size - start), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(f.gcount()));
  if (start > 0) {  // drop the partial first line
    auto nl = text.find('\n');
    text = nl == std::string::npos ? std::string() : text.substr(nl + 1);
  }
  return text;
}

std::string describe_process_end(const ProcessResult& r, double timeout_s) {
  char buf[128];
  if (!r.started) return "did not start: " + r.start_error;
  if (r.timed_out) {
    std::snprintf(buf, sizeof buf, "timed out after %.1f s (its process group was killed)", timeout_s);
    return buf;
  }
  if (r.cancelled) return "cancelled (its process group was killed)";
  if (r.exited) return "exit code " + std::to_string(r.exit_code);
  const char* name = ::strsignal(r.signal);
  return "killed by signal " + std::to_string(r.signal) + " (" + (name ? name : "?") + ")";
}

ProcessResult run_process(const ProcessSpec& spec, const std::atomic<bool>* cancel,
                          const std::function<void()>& tick) {
  ProcessResult result;
  if (spec.argv.empty()) {
    result.start_error = "empty command";
    return result;
  }
  std::string exe = find_executable(spec.argv[0]);
  if (exe.empty()) {
    result.start_error = "'" + spec.argv[0] + "' is not an executable file" +
                         (spec.argv[0].find('/') == std::string::npos ? " on PATH" : "");
    return result;
  }

  int log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    result.start_error = "cannot write the log file " + spec.log_path + " (" + std::strerror(errno) + ")";
    return result;
  }
  if (!spec.log_header.empty()) {
    ssize_t w = ::write(log_fd, spec.log_header.data(), spec.log_header.size());
    (void)w;
  }
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  // Everything the child needs, prepared before fork.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& [k, v] : spec.env) overridden = overridden || k == key;
    if (!overridden) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();

  // exec failures come back through a close-on-exec pipe: EOF means exec succeeded.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    throw RuntimeError(std::string("[lab] pipe() failed (") + std::strerror(errno) + ")");
  }
  const pid_t parent = ::getpid();
  auto t0 = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    throw RuntimeError(std::string("[lab] fork() failed (") + std::strerror(e) + ") — too many processes?");
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the runner died before prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    int err = 0;
    if (cwd && ::chdir(cwd) != 0) err = errno;
    if (err == 0) {
      if (null_fd >= 0) ::dup2(null_fd, 0);
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
      ::execve(exe.c_str(), argv.data(), envp.data());
      err = errno;
    }
    ssize_t w = ::write(err_pipe[1], &err, sizeof err);
    (void)w;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so the group exists before we might signal it
  ::close(err_pipe[1]);
  ::close(log_fd);
  if (null_fd >= 0) ::close(null_fd);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.start_error = std::string("cannot execute ") + exe + (cwd ? " in " + spec.cwd : "") + " (" +
                         std::strerror(child_errno) + ")";
    result.wall_s = seconds_since(t0);
    return result;
  }
  result.started = true;
  if (spec.on_start) spec.on_start(static_cast<int>(pid));

  bool cancelled = false;
  bool ended = wait_until(pid, t0, spec.timeout_s > 0 ? spec.timeout_s : -1.0, cancel, tick, &cancelled);
  if (!ended) {
    result.timed_out = !cancelled;
    result.cancelled = cancelled;
    ::kill(-pid, SIGTERM);
    ended = wait_until(pid, Clock::now(), spec.kill_grace_s, nullptr, {}, nullptr);
  }
  result.wall_s = seconds_since(t0);
  // The leader has ended (or ignored SIGTERM): whatever is left of its group goes now.
  ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exited = true;
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

}  // namespace scalelab::lab
