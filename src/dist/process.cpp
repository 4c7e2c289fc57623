#include "dist/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "core/error.h"

extern char** environ;

namespace scalelab {

std::string ProcessResult::describe() const {
  if (timed_out) return "timed out after " + std::to_string(static_cast<int>(seconds)) + " s";
  if (term_signal) return "killed by signal " + std::to_string(term_signal) + " (" + strsignal(term_signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  SCALELAB_CHECK(!argv.empty(), "[process] run_process: empty command");
  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) env[std::string(*e, static_cast<std::size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& k : options.unset_env) env.erase(k);
  for (const auto& [k, v] : options.env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int fds[2];
  SCALELAB_CHECK(pipe2(fds, O_CLOEXEC) == 0, std::string("[process] pipe failed: ") + std::strerror(errno));
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw RuntimeError(std::string("[process] fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    if (!options.cwd.empty() && chdir(options.cwd.c_str()) != 0) _exit(127);
    execvpe(args[0], args.data(), envp.data());
    const char msg[] = "run_process: exec failed\n";
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent, so that kill(-pid) works even before the child ran
  close(fds[1]);

  ProcessResult res;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  bool open = true;
  int status = 0;
  bool reaped = false;
  char buf[65536];
  double kill_at = options.timeout_s > 0 ? options.timeout_s : -1;
  int kill_stage = 0;
  while (open || !reaped) {
    if (open) {
      pollfd p{fds[0], POLLIN, 0};
      const int rc = poll(&p, 1, 100);
      if (rc > 0) {
        const ssize_t n = read(fds[0], buf, sizeof(buf));
        if (n > 0) {
          res.output.append(buf, static_cast<std::size_t>(n));
          if (res.output.size() > 2 * options.max_output)
            res.output.erase(0, res.output.size() - options.max_output);
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          open = false;
        }
      }
    } else {
      usleep(20000);
    }
    if (!reaped && waitpid(pid, &status, WNOHANG) == pid) reaped = true;
    // Grandchildren may keep the pipe open after the child exited: stop reading a while later.
    if (reaped && open && kill_stage == 0) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) open = false;
    }
    if (kill_at > 0 && elapsed() > kill_at) {
      res.timed_out = true;
      if (kill_stage == 0) {
        kill(-pid, SIGTERM);
        kill_stage = 1;
        kill_at += 3.0;
      } else {
        kill(-pid, SIGKILL);
        kill_stage = 2;
        kill_at = -1;
        open = false;
      }
    }
  }
  close(fds[0]);
  if (res.output.size() > options.max_output) res.output.erase(0, res.output.size() - options.max_output);
  res.seconds = elapsed();
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) res.term_signal = WTERMSIG(status);
  return res;
}

}  // namespace scalelab
