#include "telemetry/proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <deque>
#include <map>
#include <set>
#include <sstream>

namespace scalelab {

std::optional<std::string> read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

std::optional<PidStat> parse_pid_stat(const std::string& text) {
  // "pid (comm) state ppid ...": comm can hold anything, so split at the first '(' and last ')'.
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  PidStat s;
  s.pid = std::atoi(text.substr(0, open).c_str());
  s.comm = text.substr(open + 1, close - open - 1);
  std::istringstream in(text.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3 (state)
  std::string tok;
  while (in >> tok) f.push_back(tok);
  if (f.size() < 22) return std::nullopt;
  auto u = [&](int field) { return std::strtoull(f[field - 3].c_str(), nullptr, 10); };
  s.state = f[0].empty() ? '?' : f[0][0];
  s.ppid = std::atoi(f[1].c_str());
  s.utime = u(14);
  s.stime = u(15);
  s.cutime = u(16);
  s.cstime = u(17);
  s.starttime = u(22);
  s.rss_pages = std::strtoll(f[24 - 3].c_str(), nullptr, 10);
  return s;
}

std::optional<PidStat> read_pid_stat(int pid, const std::string& proc_root) {
  auto text = read_small_file(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!text) return std::nullopt;
  return parse_pid_stat(*text);
}

std::optional<CpuTimes> parse_proc_stat_cpu(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu ", 0) != 0) continue;
    std::istringstream ls(line.substr(4));
    CpuTimes c;
    if (!(ls >> c.user >> c.nice >> c.system >> c.idle)) return std::nullopt;
    // Older kernels stop after idle; the rest stay 0.
    ls >> c.iowait >> c.irq >> c.softirq >> c.steal;
    return c;
  }
  return std::nullopt;
}

std::optional<CpuTimes> read_system_cpu(const std::string& proc_root) {
  auto text = read_small_file(proc_root + "/stat");
  if (!text) return std::nullopt;
  return parse_proc_stat_cpu(*text);
}

std::optional<double> cpu_busy_pct(const CpuTimes& before, const CpuTimes& after) {
  if (after.total() <= before.total()) return std::nullopt;
  const double total = static_cast<double>(after.total() - before.total());
  const double idle = after.idle_all() >= before.idle_all()
                          ? static_cast<double>(after.idle_all() - before.idle_all())
                          : 0.0;
  double pct = 100.0 * (total - idle) / total;
  if (pct < 0) pct = 0;
  return pct;
}

std::optional<MemInfo> parse_meminfo(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::optional<double> total, avail;
  while (std::getline(in, line)) {
    auto value_kb = [&](const char* key) -> std::optional<double> {
      const std::string k = key;
      if (line.rfind(k, 0) != 0) return std::nullopt;
      return std::strtod(line.c_str() + k.size(), nullptr) * 1024.0;
    };
    if (auto v = value_kb("MemTotal:")) total = v;
    if (auto v = value_kb("MemAvailable:")) avail = v;
  }
  if (!total || !avail) return std::nullopt;
  return MemInfo{*total, *avail};
}

std::optional<MemInfo> read_meminfo(const std::string& proc_root) {
  auto text = read_small_file(proc_root + "/meminfo");
  if (!text) return std::nullopt;
  return parse_meminfo(*text);
}

namespace {

std::vector<int> numeric_entries(const std::string& dir) {
  std::vector<int> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0) out.push_back(static_cast<int>(v));
  }
  ::closedir(d);
  return out;
}

// Children of `pid` from /proc/<pid>/task/*/children; nullopt when the kernel has no such files.
std::optional<std::vector<int>> children_from_task_lists(int pid, const std::string& proc_root) {
  const std::string task_dir = proc_root + "/" + std::to_string(pid) + "/task";
  std::vector<int> out;
  bool any_file = false;
  for (int tid : numeric_entries(task_dir)) {
    auto text = read_small_file(task_dir + "/" + std::to_string(tid) + "/children");
    if (!text) continue;
    any_file = true;
    std::istringstream in(*text);
    int c;
    while (in >> c) out.push_back(c);
  }
  if (!any_file) return std::nullopt;
  return out;
}

}  // namespace

std::vector<int> process_tree(int root, const std::string& proc_root, const std::set<int>& prune) {
  if (!read_pid_stat(root, proc_root)) return {};
  std::vector<int> out;
  std::set<int> seen;
  std::deque<int> queue{root};
  std::optional<std::multimap<int, int>> by_parent;  // built once if the task lists are absent
  while (!queue.empty()) {
    const int pid = queue.front();
    queue.pop_front();
    if (!seen.insert(pid).second) continue;
    if (pid != root && prune.count(pid)) continue;
    out.push_back(pid);
    std::vector<int> kids;
    if (!by_parent) {
      if (auto k = children_from_task_lists(pid, proc_root)) {
        kids = std::move(*k);
      } else if (pid == root) {
        by_parent.emplace();
        for (int p : numeric_entries(proc_root))
          if (auto st = read_pid_stat(p, proc_root)) by_parent->emplace(st->ppid, p);
      }
      // A descendant whose task dir vanished in between simply has no children.
    }
    if (by_parent) {
      auto [b, e] = by_parent->equal_range(pid);
      for (auto it = b; it != e; ++it) kids.push_back(it->second);
    }
    for (int k : kids) queue.push_back(k);
  }
  return out;
}

long clock_ticks_per_second() {
  static const long v = [] {
    const long t = ::sysconf(_SC_CLK_TCK);
    return t > 0 ? t : 100;
  }();
  return v;
}

long page_size_bytes() {
  static const long v = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? p : 4096;
  }();
  return v;
}

}  // namespace scalelab
