#include "core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/allocator.h"  // format_bytes

extern char** environ;

namespace scalelab {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// In the child, after fork: every descriptor from 3 up becomes close-on-exec (close_range when the
// kernel has it, else one fcntl per descriptor up to the limit measured before the fork).
void cloexec_from_3(int max_fd) {
#if defined(SYS_close_range)
  constexpr unsigned kCloseRangeCloexec = 1u << 2;  // CLOSE_RANGE_CLOEXEC (Linux 5.11)
  if (::syscall(SYS_close_range, 3u, ~0u, kCloseRangeCloexec) == 0) return;
#endif
  for (int fd = 3; fd < max_fd; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

}  // namespace

std::string find_executable(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    // Built by append: GCC 12 warns falsely (-Wrestrict) on `dir + "/" + name` here.
    std::string candidate = end > start ? dirs.substr(start, end - start) : std::string(1, '.');
    candidate.append(1, '/').append(name);
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFEXITED(status)) {
    s.exited = true;
    s.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  }
  return s;
}

std::string ExitStatus::describe() const {
  if (exited) return "exit code " + std::to_string(code);
  if (signal == 0) return "ended (status unknown)";
  const char* name = ::strsignal(signal);
  return "killed by signal " + std::to_string(signal) + " (" + (name ? name : "?") + ")";
}

Subprocess Subprocess::start(const SubprocessSpec& spec) {
  if (spec.argv.empty()) throw SubprocessStartError("empty command");
  const std::string exe = find_executable(spec.argv[0]);
  if (exe.empty()) {
    throw SubprocessStartError("'" + spec.argv[0] + "' is not an executable file" +
                               (spec.argv[0].find('/') == std::string::npos ? " on PATH" : ""));
  }

  // Everything the child needs, prepared before fork.
  std::vector<std::string> argv_copy = spec.argv;
  std::vector<char*> argv;
  for (auto& a : argv_copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    bool drop = std::find(spec.unset_env.begin(), spec.unset_env.end(), key) != spec.unset_env.end();
    for (const auto& [k, v] : spec.env) drop = drop || k == key;
    if (!drop) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();
  rlimit lim{};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 16))
                         : 1 << 16;

  // The child's stdout/stderr: a log file or a pipe (read end kept here).
  int out_read = -1, out_write = -1;
  if (!spec.log_path.empty()) {
    out_write = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_write < 0) {
      throw SubprocessStartError("cannot write the log file " + spec.log_path + " (" + std::strerror(errno) + ")");
    }
    if (!spec.log_header.empty()) {
      [[maybe_unused]] const ssize_t w = ::write(out_write, spec.log_header.data(), spec.log_header.size());
    }
  } else {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw RuntimeError(std::string("[subprocess] pipe2 failed: ") + std::strerror(errno));
    out_read = fds[0];
    out_write = fds[1];
  }
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // exec failures come back through a close-on-exec pipe: EOF means exec succeeded.
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    close_fd(out_read);
    close_fd(out_write);
    close_fd(null_fd);
    throw RuntimeError(std::string("[subprocess] pipe2 failed: ") + std::strerror(e));
  }

  const pid_t parent = ::getpid();
  const bool group = spec.own_process_group;
  const bool die_with_parent = spec.die_with_parent;
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    close_fd(out_read);
    close_fd(out_write);
    close_fd(null_fd);
    close_fd(err_pipe[0]);
    close_fd(err_pipe[1]);
    throw RuntimeError(std::string("[subprocess] fork failed (") + std::strerror(e) + ") — too many processes?");
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    if (group) ::setpgid(0, 0);
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the host died before prctl
    }
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
      ::dup2(out_write, 1);
      ::dup2(out_write, 2);
      cloexec_from_3(max_fd);
      ::execve(exe.c_str(), argv.data(), envp.data());
      err = errno;
    }
    [[maybe_unused]] const ssize_t w = ::write(err_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  if (group) ::setpgid(pid, pid);  // also from here, so the group exists before it may be signalled
  close_fd(err_pipe[1]);
  close_fd(out_write);
  close_fd(null_fd);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  close_fd(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close_fd(out_read);
    throw SubprocessStartError("cannot execute " + exe + (cwd ? " in " + spec.cwd : std::string()) + " (" +
                               std::strerror(child_errno) + ")");
  }
  Subprocess p;
  p.pid_ = pid;
  p.out_fd_ = out_read;
  p.group_ = group;
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(o.pid_), out_fd_(o.out_fd_), group_(o.group_), reaped_(o.reaped_), status_(o.status_) {
  o.pid_ = -1;
  o.out_fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    release();
    pid_ = o.pid_;
    out_fd_ = o.out_fd_;
    group_ = o.group_;
    reaped_ = o.reaped_;
    status_ = o.status_;
    o.pid_ = -1;
    o.out_fd_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() { release(); }

void Subprocess::release() {
  if (valid() && !reaped_) {
    signal(SIGKILL);
    reap();
  }
  close_output();
  pid_ = -1;
  reaped_ = false;
  status_ = {};
}

void Subprocess::close_output() { close_fd(out_fd_); }

bool Subprocess::wait_ended(std::chrono::milliseconds timeout) {
  if (!valid() || reaped_) return true;
  const auto deadline = Clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(2);
  for (;;) {
    siginfo_t info{};
    const int r = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
    if (r == 0 && info.si_pid == pid_) return true;
    if (r < 0 && errno != EINTR) return true;  // ECHILD: nothing left to wait for
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(sleep, deadline - now));
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
}

void Subprocess::signal(int sig) {
  if (!valid() || reaped_) return;
  ::kill(group_ ? -pid_ : pid_, sig);
}

ExitStatus Subprocess::reap() {
  if (!valid() || reaped_) return status_;
  bool zombie = false;
  for (;;) {  // the leader ends (it stays a zombie, keeping the group id reserved) ...
    siginfo_t info{};
    const int r = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT);
    zombie = r == 0;
    if (r == 0 || errno != EINTR) break;
  }
  // ... whatever is left of its group goes (only while the zombie holds the id: a pid reaped
  // elsewhere may already name a stranger's group) ...
  if (group_ && zombie) ::kill(-pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);  // ... and the leader is reaped.
  } while (r < 0 && errno == EINTR);
  if (r == pid_) status_ = ExitStatus::from_wait_status(status);
  reaped_ = true;
  return status_;
}

std::optional<ExitStatus> Subprocess::wait_for(std::chrono::milliseconds timeout) {
  if (!wait_ended(timeout)) return std::nullopt;
  return reap();
}

ExitStatus Subprocess::terminate(std::chrono::milliseconds grace) {
  if (!wait_ended(std::chrono::milliseconds(0))) {
    signal(SIGTERM);
    if (!wait_ended(grace)) signal(SIGKILL);
  }
  return reap();
}

std::string SubprocessResult::describe() const {
  if (!started) return "did not start: " + start_error;
  char buf[128];
  if (timed_out) {
    std::snprintf(buf, sizeof buf, "timed out after %.1f s (its process group was killed)", timeout_s);
    return buf;
  }
  if (cancelled) return "cancelled (its process group was killed)";
  if (log_overflow) {
    return "its log passed " + format_bytes(max_log_bytes) +
           " (the limit on a trial's output, --max-log-size) and its process group was killed";
  }
  return status.describe();
}

SubprocessResult run_subprocess(const SubprocessSpec& spec, const std::atomic<bool>* cancel,
                                const std::function<void()>& tick) {
  SubprocessResult res;
  res.timeout_s = spec.timeout_s;
  res.max_log_bytes = spec.max_log_bytes;
  const auto t0 = Clock::now();
  Subprocess p;
  try {
    p = Subprocess::start(spec);
  } catch (const SubprocessStartError& e) {
    res.start_error = e.what();
    res.wall_s = seconds_since(t0);
    return res;
  }
  res.started = true;
  if (spec.on_start) spec.on_start(p.pid());

  const std::size_t keep = std::max<std::size_t>(spec.max_output, 1);
  char buf[65536];
  // Reads what the pipe has within `wait_ms`; false at EOF (the pipe is then closed).
  auto read_some = [&](int wait_ms) {
    pollfd pfd{p.output_fd(), POLLIN, 0};
    const int pr = ::poll(&pfd, 1, wait_ms);
    if (pr <= 0) return pr == 0 || errno == EINTR;
    const ssize_t n = ::read(p.output_fd(), buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      p.close_output();
      return false;
    }
    res.output.append(buf, static_cast<std::size_t>(n));
    if (res.output.size() > 2 * keep) res.output.erase(0, res.output.size() - keep);
    return true;
  };

  int stage = 0;  // 0: running; 1: SIGTERM sent; 2: SIGKILL sent
  double term_at = 0;
  auto last_tick = Clock::now();
  int sleep_ms = 2;
  for (;;) {
    if (p.output_fd() >= 0) {
      read_some(sleep_ms);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    sleep_ms = std::min(sleep_ms * 2, 50);
    if (p.wait_ended(std::chrono::milliseconds(0))) break;
    if (stage == 0) {
      if (cancel && cancel->load()) res.cancelled = true;
      else if (spec.timeout_s > 0 && seconds_since(t0) >= spec.timeout_s) res.timed_out = true;
      else if (spec.max_log_bytes > 0 && !spec.log_path.empty()) {
        struct stat st {};
        if (::stat(spec.log_path.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) > spec.max_log_bytes) {
          res.log_overflow = true;
        }
      }
      if (res.cancelled || res.timed_out || res.log_overflow) {
        p.signal(SIGTERM);
        stage = 1;
        term_at = seconds_since(t0);
      } else if (tick && seconds_since(last_tick) >= 0.5) {
        tick();
        last_tick = Clock::now();
      }
    } else if (stage == 1 && seconds_since(t0) - term_at >= spec.kill_grace_s) {
      p.signal(SIGKILL);
      stage = 2;
    }
  }
  res.wall_s = seconds_since(t0);
  // Its own children may still hold the pipe: read on while they write (at most 2 s), and stop
  // after 200 ms of silence; reap() then kills what is left of the group.
  const auto drain_until = Clock::now() + std::chrono::seconds(2);
  while (p.output_fd() >= 0 && Clock::now() < drain_until) {
    const std::size_t before = res.output.size();
    if (!read_some(200)) break;
    if (res.output.size() == before) break;
  }
  p.close_output();
  res.status = p.reap();
  if (res.output.size() > keep) res.output.erase(0, res.output.size() - keep);
  return res;
}

}  // namespace scalelab
