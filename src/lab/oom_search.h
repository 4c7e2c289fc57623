#pragma once
// The OOM search: the largest micro-batch that fits, found with real trials.
//
// It starts from a hint: the engine's memory plan (`<engine> plan ... --json`, its
// "max_micro_batch_size") when one is available, else a micro-batch known or guessed to fit
// (default 1). From the hint it goes up (to hint+1 when the hint is the plan's estimate, else
// doubling) until a trial runs out of memory, or down by bisection when the hint itself does not
// fit, then bisects. It ends only when real trials show that b fits and b+1 does not (or that 1
// does not fit: the answer is 0). Every trial is recorded; a trial that neither fits nor runs out
// of memory (an error, a timeout, a refused configuration) stops the search with that reason.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lab/executor.h"

namespace scalelab::lab {

struct OomSearchSettings {
  int hint = 1;                   // first micro-batch tried
  bool hint_is_estimate = false;  // true: after the hint fits, try hint+1 before doubling
  int max_micro_batch = 4096;     // never try more; a fit there ends the search ("capped")
};

struct OomSearchTrace {
  int max_fit = 0;       // the largest fitting micro-batch (0: even 1 runs out of memory)
  bool capped = false;   // max_micro_batch fits, the true limit is at least that
  std::vector<int> probed;  // micro-batches tried, in order
};

// The search logic over an abstract probe (true: fits, false: out of memory; it throws to abort).
OomSearchTrace search_max_fit(const std::function<bool(int)>& probe, const OomSearchSettings& settings);

// A memory plan: the largest micro-batch it predicts to fit for the base parameters, or nullopt
// with *note saying why there is none.
using PlanFn = std::function<std::optional<int>(const ParamMap& base, std::string* note)>;

// The native engine's plan: runs `<engine> plan <flags> --micro-batch-size 1 --json FILE` (its log
// and JSON go to the executor's log directory) and reads "max_micro_batch_size".
PlanFn native_plan(const TrialExecutor& exec);

struct OomSearchResult {
  int max_micro_batch_size = 0;
  bool capped = false;
  bool failed = false;   // a trial neither fit nor ran out of memory
  bool refused = false;  // ... because the workload refused the configuration (exit code 2)
  std::string failure;
  std::optional<int> plan_estimate;
  std::string plan_note;  // why there is no plan estimate
  struct Probe {
    int micro_batch_size;
    std::int64_t trial_id;
    TrialStatus status;
  };
  std::vector<Probe> probes;
  std::optional<TrialRow> best;        // the trial at max_micro_batch_size
  std::optional<TrialRow> first_oom;   // the trial at max_micro_batch_size + 1

  Json to_json() const;
  static OomSearchResult from_json(const Json& j);  // probes and numbers (not the rows)
};

struct OomSearchRequest {
  ParamMap base;               // without micro_batch_size
  std::string role = "oom-search";
  OomSearchSettings settings;  // hint = a micro-batch believed to fit (used when there is no plan)
  bool use_plan = true;
};

// The configuration an OOM search is for, given any of its trials' parameters: the parameters
// without micro_batch_size, as text (a sweep's [oom_search] stores its limits under this key).
std::string oom_search_key(const ParamMap& params);

// Runs the search with real trials through `exec` (recorded; already-recorded trials are reused).
OomSearchResult run_oom_search(TrialExecutor& exec, const OomSearchRequest& request, const PlanFn& plan);

}  // namespace scalelab::lab
