#pragma once
// One runner per results database. A runner (sweep, oom-search, ladder) holds an exclusive
// flock(2) on "<db>.lock" for as long as it runs. The kernel drops the lock when the process
// ends in any way (kill -9 included), so a stale lock never needs cleaning up. The lock file
// holds the holder's pid, host, command and start time, for the second runner's message.
// Readers (`scalelab results`) take no lock: SQLite's WAL lets them read while a runner writes.
// (flock, not a lock row in the database: a row would outlive a killed runner.)
#include <atomic>
#include <functional>
#include <string>

#include "core/error.h"
#include "lab/interrupted.h"

namespace scalelab::lab {

class RunnerLock {
 public:
  // Takes the lock for `db_path`; `what` describes this runner ("sweep batch-sweep").
  // Another holder: wait = false throws RuntimeError naming it and what to do; wait = true calls
  // notify(message) once and polls until the lock is free (Interrupted if *cancel becomes true).
  RunnerLock(const std::string& db_path, const std::string& what, bool wait,
             const std::atomic<bool>* cancel = nullptr,
             const std::function<void(const std::string&)>& notify = {});
  ~RunnerLock();
  RunnerLock(const RunnerLock&) = delete;
  RunnerLock& operator=(const RunnerLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace scalelab::lab
