#pragma once
// Readers of Linux's /proc for the process and host sources. Each parse_* function takes a file's
// text (so tests can feed it anything) and each read_* reads the file under `proc_root`.
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace scalelab {

// /proc/<pid>/stat, the fields telemetry uses (proc(5)).
struct PidStat {
  int pid = 0;
  std::string comm;  // may contain spaces and parentheses
  char state = '?';  // R, S, D, Z, ...
  int ppid = 0;
  unsigned long long utime = 0, stime = 0;    // clock ticks, all threads
  unsigned long long cutime = 0, cstime = 0;  // clock ticks of waited-for children
  unsigned long long starttime = 0;           // clock ticks after boot
  long long rss_pages = 0;
};
std::optional<PidStat> parse_pid_stat(const std::string& text);
std::optional<PidStat> read_pid_stat(int pid, const std::string& proc_root = "/proc");

// The aggregate "cpu" line of /proc/stat, in clock ticks.
struct CpuTimes {
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                     steal = 0;
  unsigned long long total() const { return user + nice + system + idle + iowait + irq + softirq + steal; }
  unsigned long long idle_all() const { return idle + iowait; }
};
std::optional<CpuTimes> parse_proc_stat_cpu(const std::string& text);
std::optional<CpuTimes> read_system_cpu(const std::string& proc_root = "/proc");
// Busy share of all cores between two readings, in percent (0..100); nullopt when no time passed.
std::optional<double> cpu_busy_pct(const CpuTimes& before, const CpuTimes& after);

// /proc/meminfo: MemTotal and MemAvailable, in bytes.
struct MemInfo {
  double total_bytes = 0;
  double available_bytes = 0;
};
std::optional<MemInfo> parse_meminfo(const std::string& text);
std::optional<MemInfo> read_meminfo(const std::string& proc_root = "/proc");

// `root` and all its descendants (root first, then breadth first). Uses the children lists of
// /proc/<pid>/task/<tid>/children, or a scan of every /proc/<pid>/stat where the kernel has no
// such lists. Empty when `root` no longer exists. Pids in `prune` are left out with their
// descendants (telemetry's own nvidia-smi child, when the tree is this process's).
std::vector<int> process_tree(int root, const std::string& proc_root = "/proc",
                              const std::set<int>& prune = {});

// sysconf(_SC_CLK_TCK) and the page size.
long clock_ticks_per_second();
long page_size_bytes();

// Whole text of a small file (/proc and /sys files report size 0, so read until EOF); nullopt
// when it cannot be opened or read.
std::optional<std::string> read_small_file(const std::string& path);

}  // namespace scalelab
