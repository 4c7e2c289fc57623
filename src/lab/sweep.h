#pragma once
// Runs a sweep: every combination of the spec times its repeats, skipping trials the database
// already has (resumption), each trial isolated (a crash, an OOM or a hang is recorded and the
// sweep goes on).
#include <cstdint>

#include "lab/executor.h"
#include "lab/progress.h"
#include "lab/spec.h"
#include "lab/store.h"

namespace scalelab::lab {

struct SweepRunSummary {
  std::int64_t sweep_id = 0;
  int combinations = 0;
  int total = 0;         // combinations x repeats
  int already_done = 0;  // found in the database
  int ran = 0;
  int ok = 0, oom = 0, failed = 0;  // of the trials run now
  int oom_searches = 0;             // [oom_search]: configurations searched
  std::string log_dir;
};

// What a sweep consists of, stored as the sweep's result before it runs: {"configs": [config
// hashes in spec order], "repeats": N}. The summary table shows these configurations (trials of
// configurations an edited spec no longer has stay in the database but out of the table).
Json sweep_membership(const SweepSpec& spec);

// Records the sweep (kind "sweep", its spec and membership) and runs what is missing; with
// [oom_search], then each configuration's largest fitting micro-batch (stored in the sweep's
// result as "oom_limits": OomSearchResult::to_json() + "key" + "params").
// options.timeout_s is used as given (the CLI decides between --timeout and the spec's timeout).
// Takes no lock: the caller holds the RunnerLock. Throws Interrupted when options.cancel fires
// (finished trials are kept).
SweepRunSummary run_sweep(const SweepSpec& spec, ResultsStore& store, const LabOptions& options, Progress& progress);

}  // namespace scalelab::lab
