#pragma once
// Helpers for the lab's tests: temporary directories, running the scalelab binary, and wrappers
// that run the fake engine / fake workload scripts with the real python3 interpreter (the pyenv
// shim on PATH costs a few hundred milliseconds per start; -S skips site, the scripts need none).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab/command_template.h"

namespace scalelab::lab::testing {

namespace fs = std::filesystem;

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "scalelab-lab-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (!p) std::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// The python3 interpreter behind PATH's python3 (resolved once).
inline const std::string& python_exe() {
  static const std::string exe = [] {
    std::string out;
    if (FILE* p = ::popen("python3 -c 'import sys; print(sys.executable)' 2>/dev/null", "r")) {
      char buf[4096];
      while (std::fgets(buf, sizeof buf, p)) out += buf;
      ::pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out.empty() ? std::string("python3") : out;
  }();
  return exe;
}

inline std::string source_path(const std::string& rel) { return std::string(SCALELAB_SOURCE_DIR) + "/" + rel; }

// An executable `dir/name` running `python3 -S script "$@"`.
inline std::string python_wrapper(const TempDir& dir, const std::string& name, const std::string& script) {
  std::string path = dir / name;
  write_text(path, "#!/bin/sh\nexec " + shell_quote(python_exe()) + " -S " + shell_quote(script) + " \"$@\"\n");
  fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  return path;
}
inline std::string fake_engine(const TempDir& dir) {
  return python_wrapper(dir, "fake-engine", source_path("tests/lab/fake_engine.py"));
}
inline std::string fake_workload(const TempDir& dir) {
  return python_wrapper(dir, "fake-workload", source_path("tests/lab/fake_workload.py"));
}

// Appends " <word, shell-quoted>" (written out: GCC 12 misreads "x" + std::string at -O3).
inline void add_word(std::string& cmd, const std::string& word) {
  cmd += ' ';
  cmd += shell_quote(word);
}

struct CliResult {
  int code = -1;
  std::string out, err;
};

// Runs `scalelab <args>` in `cwd` with extra environment assignments ("K=V").
inline CliResult run_scalelab(const std::vector<std::string>& args, const std::string& cwd,
                              const std::vector<std::string>& env = {}) {
  static int counter = 0;
  std::string out_file = (fs::path(cwd) / (".out" + std::to_string(counter))).string();
  std::string err_file = (fs::path(cwd) / (".err" + std::to_string(counter++))).string();
  std::string cmd = "cd " + shell_quote(cwd) + " && env";
  for (const auto& e : env) add_word(cmd, e);
  add_word(cmd, SCALELAB_EXE);
  for (const auto& a : args) add_word(cmd, a);
  cmd += " >" + shell_quote(out_file) + " 2>" + shell_quote(err_file) + " </dev/null";
  int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(out_file);
  r.err = read_text(err_file);
  fs::remove(out_file);
  fs::remove(err_file);
  return r;
}

// Starts `scalelab <args>` in the background (its own pid, stdout/stderr to files); returns the pid.
inline pid_t start_scalelab(const std::vector<std::string>& args, const std::string& cwd,
                            const std::vector<std::string>& env, const std::string& out_file,
                            const std::string& err_file) {
  std::string cmd = "cd " + shell_quote(cwd) + " && exec env";
  for (const auto& e : env) add_word(cmd, e);
  add_word(cmd, SCALELAB_EXE);
  for (const auto& a : args) add_word(cmd, a);
  cmd += " >" + shell_quote(out_file) + " 2>" + shell_quote(err_file) + " </dev/null";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `cond` every 20 ms for up to `seconds`.
template <typename F>
bool eventually(F&& cond, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// Whether any live process's command line contains every one of `needles`.
inline bool process_mentions(const std::vector<std::string>& needles) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_text((e.path() / "cmdline").string());
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    // Zombies have an empty cmdline and are dead already.
    bool all = !cmdline.empty();
    for (const auto& n : needles) all = all && cmdline.find(n) != std::string::npos;
    if (all) return true;
  }
  return false;
}

inline bool pid_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  // A zombie is not alive.
  std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

inline int count_lines(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) ++n;
  return n;
}

}  // namespace scalelab::lab::testing
