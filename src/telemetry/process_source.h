#pragma once
// The process source: CPU use and resident memory of a followed process tree (this process by
// default; for an external command, the child the lab started and all its descendants).
//
// Series (source "process", device "process"):
//   cpu_util_pct   CPU time of the tree over the interval / wall time, 100 = one core busy
//                  (as top counts it). Sums utime+stime+cutime+cstime over the live members,
//                  so a child that exits and is reaped by a member still counts; CPU used by a
//                  descendant that exits and is reaped by a process outside the tree in the
//                  same interval is not seen. When the root is this process itself, its
//                  cutime/cstime are left out: the children it reaps are telemetry's own
//                  (the nvidia-smi probe), not the run's.
//   rss_bytes      sum of the members' resident set sizes (shared pages counted per process,
//                  as ps does)
//   num_processes  members of the tree (only when following children)
// When the root process exits (gone, or a zombie waiting to be reaped) the source notes it once
// and stops producing readings; the session carries on.
#include <sys/types.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "telemetry/source.h"

namespace scalelab {

class ProcessSource : public TelemetrySource {
 public:
  struct Options {
    pid_t root_pid = 0;           // 0: this process
    bool follow_children = true;  // include every descendant of root_pid
    std::string proc_root = "/proc";
    // Pids to leave out with their descendants: the session's own nvidia-smi child, which is in
    // this process's tree but is telemetry's cost, not the run's.
    std::function<std::vector<int>()> exclude;
  };

  explicit ProcessSource(Options options);

  std::string name() const override { return "process"; }
  std::string open() override;
  void sample(double t_s, TimeSeries& out) override;

  // The members of the tree at the last reading (for the NVML per-process memory). Thread-safe.
  std::vector<int> pids() const;
  pid_t root_pid() const { return root_; }
  // True once the root process has exited.
  bool ended() const;

 private:
  // Sum of the tree's CPU ticks and resident pages; nullopt when the root is gone or a zombie.
  struct TreeReading {
    std::vector<int> pids;
    unsigned long long ticks = 0;
    long long rss_pages = 0;
  };
  std::optional<TreeReading> read_tree() const;

  Options options_;
  pid_t root_ = 0;
  mutable std::mutex mu_;
  std::vector<int> pids_;
  bool ended_ = false;
  std::optional<unsigned long long> prev_ticks_;
  TelemetryClock::time_point prev_time_{};
};

}  // namespace scalelab
