#pragma once
// Runs trials for a runner (sweep, oom-search, ladder) and records them: each trial is a child
// process with its own log, timeout and process group (core/subprocess.h), classified into
// ok / oom / error / timeout (lab/outcome.h), and written to the results database as one row
// (lab/store.h). A trial already recorded for the same sweep, config hash and repeat is not run
// again (resumption), unless the options ask for it.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "lab/interrupted.h"
#include "lab/params.h"
#include "lab/progress.h"
#include "lab/store.h"
#include "lab/workload.h"

namespace scalelab::lab {

// Watches one trial while it runs (the telemetry component implements this): start() when the
// child runs, with its pid (= process group); stop() when it has ended, returning samples and a
// summary that are stored with the trial row in the same transaction.
class TrialMonitor {
 public:
  virtual ~TrialMonitor() = default;
  virtual void start(int pid) = 0;
  virtual void stop(std::vector<TelemetrySample>& samples, Json& summary) = 0;
};
using TrialMonitorFactory = std::function<std::unique_ptr<TrialMonitor>()>;

// How a trial's command starts and runs. Without one, the executor runs build_launch()'s command
// as a child process (core/subprocess.h). The scaling study's launchers (lab/launchers.h) wrap the
// native command in `mpirun -np N` or submit it to SLURM as a batch job.
class TrialLauncher {
 public:
  virtual ~TrialLauncher() = default;
  // The command of one trial (what the log and the database show).
  virtual Launch launch(const Workload& workload, const std::string& engine, const ParamMap& params,
                        const TrialContext& ctx) const = 0;
  // Runs it to completion, as run_subprocess does (spec holds launch()'s command, the log,
  // timeout and environment).
  virtual SubprocessResult run(const SubprocessSpec& spec, const ParamMap& params, const TrialContext& ctx,
                               const std::atomic<bool>* cancel, const std::function<void()>& tick) const = 0;
};

struct LabOptions {
  std::string db_path = "results/scalelab.db";
  std::string log_dir;        // "": <directory of the database>/logs
  std::string engine;         // the native engine executable (`<engine> train ...`)
  double timeout_s = 1800;    // per trial
  double kill_grace_s = 5;    // SIGTERM, then SIGKILL this much later
  std::uint64_t max_log_bytes = std::uint64_t{1} << 30;  // a trial whose log passes it is ended (0: no limit)
  bool retry_failed = false;  // re-run trials recorded as error or timeout
  bool rerun = false;         // re-run every trial, superseding earlier rows
  bool wait_for_lock = false; // queue behind another runner instead of refusing
  bool profile = false;       // native trials: --profile and --trace (TrialContext::profile)
  const std::atomic<bool>* cancel = nullptr;  // Ctrl-C: kill the running trial, throw Interrupted
  TrialMonitorFactory monitor;                // empty: no per-trial telemetry
  std::shared_ptr<const TrialLauncher> launcher;  // null: a plain child process
};

// The config stored (and hashed) for a trial: {"params": {...}, "workload": identity}.
Json trial_config(const Workload& workload, const ParamMap& params);
// "sweep name" -> a directory name ("batch-sweep", "ladder-llama-small-1a2b").
std::string safe_file_name(const std::string& name);
// What to say when reusing a trial recorded by the scalelab build `recorded_rev` from this build
// `this_rev` (git revisions, "-dirty" when built from a tree with uncommitted changes): another
// revision measured another build; the same "-dirty" revision may be another build too (the
// uncommitted changes are not recorded). Empty: nothing to say (the same clean revision, or no
// revision known on either side).
std::string reused_trial_note(const std::string& recorded_rev, const std::string& this_rev);

class TrialExecutor {
 public:
  TrialExecutor(ResultsStore& store, std::int64_t sweep_id, std::string sweep_name, Workload workload,
                LabOptions options, Progress& progress);

  struct Result {
    TrialRow row;
    bool cached = false;  // found in the database, not run now
  };

  // The recorded row that counts as done for (params, repeat), if any.
  std::optional<TrialRow> recorded(const ParamMap& params, int repeat) const;
  // Runs the trial unless recorded; `label` names it in progress lines (default: all params).
  // Throws Interrupted when options.cancel fired during the trial (nothing is recorded then).
  Result run(const ParamMap& params, int repeat, const std::string& role, const std::string& label = "");

  const Workload& workload() const { return workload_; }
  const LabOptions& options() const { return options_; }
  const std::string& sweep_name() const { return sweep_name_; }
  std::int64_t sweep_id() const { return sweep_id_; }
  ResultsStore& store() { return store_; }
  Progress& progress() { return progress_; }
  // <log_dir>/<sweep name>
  const std::string& log_dir() const { return dir_; }

 private:
  ResultsStore& store_;
  std::int64_t sweep_id_;
  std::string sweep_name_;
  Workload workload_;
  LabOptions options_;
  Progress& progress_;
  std::string dir_;
  std::set<std::string> ran_now_;  // "hash/repeat" of trials run by this executor
  std::set<std::string> other_builds_;  // git revisions of reused trials already noted
  bool nsys_ = false;              // external trials run under nsys profile (lab/external_profile.h)
};

// "27542.2 tokens/s/device, 3.21 GiB" for ok trials, the reason otherwise.
std::string trial_summary(const TrialRow& row);

}  // namespace scalelab::lab
