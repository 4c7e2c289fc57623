#include "telemetry/process_source.h"

#include <unistd.h>

#include <cstdio>
#include <set>

#include "telemetry/proc.h"

namespace scalelab {

ProcessSource::ProcessSource(Options options) : options_(std::move(options)) {
  root_ = options_.root_pid > 0 ? options_.root_pid : ::getpid();
}

std::optional<ProcessSource::TreeReading> ProcessSource::read_tree() const {
  const auto root = read_pid_stat(root_, options_.proc_root);
  if (!root || root->state == 'Z' || root->state == 'X') return std::nullopt;
  TreeReading r;
  std::set<int> prune;
  if (options_.exclude)
    for (int p : options_.exclude()) prune.insert(p);
  r.pids = options_.follow_children ? process_tree(root_, options_.proc_root, prune)
                                    : std::vector<int>{static_cast<int>(root_)};
  const bool self = root_ == ::getpid();
  for (int pid : r.pids) {
    const auto st = pid == root_ ? root : read_pid_stat(pid, options_.proc_root);
    if (!st) continue;  // exited between the listing and now
    r.ticks += st->utime + st->stime;
    if (!(self && pid == root_)) r.ticks += st->cutime + st->cstime;
    r.rss_pages += st->rss_pages;
  }
  return r;
}

std::string ProcessSource::open() {
  const auto r = read_tree();
  if (!r) {
    return "process " + std::to_string(root_) + " not found under " + options_.proc_root +
           " (already exited?)";
  }
  std::lock_guard<std::mutex> lock(mu_);
  pids_ = r->pids;
  prev_ticks_ = r->ticks;
  prev_time_ = TelemetryClock::now();
  return "";
}

void ProcessSource::sample(double t_s, TimeSeries& out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
  }
  const auto now = TelemetryClock::now();
  const auto r = read_tree();
  std::lock_guard<std::mutex> lock(mu_);
  if (!r) {
    ended_ = true;
    pids_.clear();
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "process: followed process %d ended at t=%.2f s; no further process readings",
                  static_cast<int>(root_), t_s);
    note(buf);
    return;
  }
  pids_ = r->pids;
  const double dt = std::chrono::duration<double>(now - prev_time_).count();
  // CPU times count in clock ticks (10 ms): over less than a few ticks the ratio is noise, so
  // a reading that close to the previous one (the first tick, right after open()) gives none
  // and the next one spans both.
  const double min_dt = 3.0 / static_cast<double>(clock_ticks_per_second());
  if (!prev_ticks_ || dt >= min_dt) {
    if (prev_ticks_) {
      // A member reaped by a process outside the tree takes its ticks with it: never negative.
      const double dticks =
          r->ticks >= *prev_ticks_ ? static_cast<double>(r->ticks - *prev_ticks_) : 0.0;
      out.append("process", "process", "cpu_util_pct", t_s,
                 100.0 * dticks / static_cast<double>(clock_ticks_per_second()) / dt);
    }
    prev_ticks_ = r->ticks;
    prev_time_ = now;
  }
  out.append("process", "process", "rss_bytes", t_s,
             static_cast<double>(r->rss_pages) * static_cast<double>(page_size_bytes()));
  if (options_.follow_children)
    out.append("process", "process", "num_processes", t_s, static_cast<double>(r->pids.size()));
}

std::vector<int> ProcessSource::pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pids_;
}

bool ProcessSource::ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

}  // namespace scalelab
