#pragma once
// One run of a lab runner command (sweep, oom-search, ladder, scale): what each of them does
// around its own search — a progress display on stderr, the database's runner lock, the results
// store, the sweep row and the trial executor, the interruption (Ctrl-C kills the running trial,
// finished ones stay recorded), and the end: the table on stdout, its notes, the --json file and
// the line saying where the results and logs are. The command supplies only what it runs and
// how its outcome maps to an exit code (src/cli).
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "lab/executor.h"
#include "lab/progress.h"
#include "lab/runner_lock.h"
#include "lab/store.h"
#include "lab/table.h"
#include "lab/workload.h"

namespace scalelab::lab {

// How a runner's body ended.
enum class RunnerOutcome { kCompleted, kInterrupted };

class Runner {
 public:
  // Opens the progress display (stderr), shows `notes` (lines; may be empty), takes the lock of
  // options.db_path as "<command> <name>" (waiting when options.wait_for_lock), and opens the
  // store read-write. `name` is the sweep's name.
  Runner(LabOptions options, const std::string& command, std::string name, const std::string& notes = "");
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  const LabOptions& options() const { return options_; }
  const std::string& name() const { return name_; }
  Progress& progress() { return progress_; }
  ResultsStore& store() { return store_; }

  // Records the sweep (`kind`, `spec`), clears its stored result (a stale one from an interrupted
  // run must not be shown) when `clear_result`, and makes the executor for `workload`.
  TrialExecutor& open_sweep(const std::string& kind, const Json& spec, const Workload& workload,
                            bool clear_result = true);
  TrialExecutor& executor();
  std::int64_t sweep_id() const { return sweep_id_; }
  void set_result(const Json& result);

  // Runs `body`. An Interrupted is printed with how to resume (`resume_hint`) and comes back as
  // kInterrupted; the progress bar is cleared either way.
  RunnerOutcome run(const std::function<void()>& body,
                    const std::string& resume_hint = "run the same command again to resume (recorded trials are reused).");

  // The table on stdout in `format`; its notes go to stderr unless the format carries them
  // (markdown). With a non-empty `json_path`, `json` is written there (InvalidInput naming --json
  // when it cannot be).
  void print_table(const Table& table, TableFormat format, const std::string& json_path = "",
                   const Json& json = Json()) const;
  // {"sweep": name, "db": path, <rows_key>: the table's rows, "notes": its notes}: a --json file.
  Json table_json(const Table& table, const std::string& rows_key) const;
  // "Results: <db> (scalelab results --db <db> --sweep <name>); logs in <dir>" on stderr.
  void print_footer(bool blank_line_before = true) const;
  // Where this run's trial logs go.
  std::string log_dir() const;

 private:
  bool show_notes(const std::string& notes);  // before the lock: its waiting message comes after

  LabOptions options_;
  std::string name_;
  Progress progress_;
  bool notes_shown_;
  RunnerLock lock_;
  ResultsStore store_;
  std::int64_t sweep_id_ = -1;
  std::unique_ptr<TrialExecutor> executor_;
};

// Writes text to a file; InvalidInput naming `flag` when it cannot.
void write_text_file(const std::string& path, const std::string& text, const std::string& flag);

}  // namespace scalelab::lab
