#pragma once
// Flags and plumbing shared by the lab's runner commands (sweep, oom-search, ladder, scale; the run
// itself is a lab::Runner, lab/runner.h):
// the database, logs, timeouts, the engine executable, the workload of oom-search/ladder, and
// Ctrl-C handling (the running trial's process group is killed, finished trials stay recorded,
// and the command exits 130).
#include <atomic>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lab/executor.h"
#include "lab/params.h"
#include "lab/runner_lock.h"
#include "lab/workload.h"

namespace scalelab::cli {

struct LabFlags {
  std::string db = "results/scalelab.db";
  std::string log_dir;
  std::string engine;
  double timeout_s = 1800;
  double kill_grace_s = 5;
  std::string max_log_size = "1GiB";
  bool wait = false;
  bool retry_failed = false;
  bool rerun = false;
  bool no_telemetry = false;       // every trial is sampled unless --no-telemetry
  int telemetry_interval_ms = 200;
  bool profile = false;            // native trials run with --profile and --trace
};
void add_lab_flags(CLI::App* app, LabFlags& flags);

// The native engine: --engine, else $SCALELAB_ENGINE, else this binary (/proc/self/exe).
std::string resolve_engine(const std::string& flag);
lab::LabOptions lab_options(const LabFlags& flags, const std::atomic<bool>* cancel);

// The flags of the micro-batch searches (oom-search, ladder) beside the lab's and the workload's:
// --name, --max-micro-batch, --no-plan, --json (what it writes: `json_what`), --format.
struct SearchFlags {
  std::string name;
  std::string json;
  std::string format = "md";
  int max_micro_batch = 4096;
  bool no_plan = false;
};
void add_search_flags(CLI::App* app, SearchFlags& flags, const std::string& command, const std::string& json_what);

// The workload of oom-search and ladder: native (default), --command TEMPLATE, or --spec FILE.
struct WorkloadFlags {
  std::string command;
  std::string spec;
  std::vector<std::string> metrics;  // NAME=REGEX
  std::string oom_pattern;
};
void add_workload_flags(CLI::App* app, WorkloadFlags& flags);

struct ResolvedWorkload {
  lab::Workload workload;
  lab::ParamMap params;  // fixed parameters: the spec's, then the forwarded flags
  std::string spec_name;
  std::string notes;     // defaults applied, printed by the command
};
// `forwarded`: the command line's unknown flags (train flags / placeholder values).
// `runner_params`: parameters the command sets itself (allowed as placeholders).
ResolvedWorkload resolve_workload(const WorkloadFlags& flags, const std::vector<std::string>& forwarded,
                                  const std::vector<std::string>& runner_params);

// Native trials of oom-search and ladder need a bounded run: without --max-steps they get
// kDefaultSearchSteps (2 warm-up + 3 measured with the engine's default warm-up); noted in w.notes.
inline constexpr int kDefaultSearchSteps = 5;
void apply_default_steps(ResolvedWorkload& w);
// "<prefix>-<model or spec name>-<8 hex of the workload, parameters and extra>".
std::string default_sweep_name(const std::string& prefix, const ResolvedWorkload& w, const lab::Json& extra);

// SIGINT/SIGTERM set a flag while this lives (a second Ctrl-C kills as usual).
class InterruptFlag {
 public:
  InterruptFlag();
  ~InterruptFlag();
  InterruptFlag(const InterruptFlag&) = delete;
  InterruptFlag& operator=(const InterruptFlag&) = delete;
  const std::atomic<bool>* get() const;
};

// The exit code of a runner stopped by Ctrl-C / SIGTERM (lab::RunnerOutcome::kInterrupted): 128 + SIGINT,
// as a shell reports a command ended by Ctrl-C.
inline constexpr int kExitInterrupted = 130;

}  // namespace scalelab::cli
