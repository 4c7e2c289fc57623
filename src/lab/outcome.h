#pragma once
// A trial's outcome from how its process ended and what it left behind: ok / oom / error /
// timeout, the reason, and its metrics (from the native run record, or from an external
// workload's log through the workload's regular expressions).
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "lab/params.h"
#include "lab/trial_status.h"
#include "lab/workload.h"

namespace scalelab::lab {


struct TrialOutcome {
  TrialStatus status = TrialStatus::kError;
  std::string reason;              // empty when ok
  Json metrics = Json::object();   // name -> number
  Json record;                     // the native run record (null for external workloads)
  bool refused = false;            // exit code 2: the workload refused the configuration
};

// The first capture group of the last line matching each rule, as numbers.
Json extract_metrics(const std::vector<MetricRule>& rules, const std::string& log_text);
// The first line matching `oom`, trimmed to 300 characters; "" when none.
std::string find_matching_line(const std::regex& oom, const std::string& log_text);
// The last non-empty line of the text, trimmed to 300 characters.
std::string last_line(const std::string& text);

// Native: reads the run record at record_path (status ok/oom/error, metrics) and the exit code
// (0 ok, 2 refused, 3 out of memory, else error).
TrialOutcome classify_native(const SubprocessResult& proc, double timeout_s, const std::string& record_path,
                             const std::string& log_text);
// External: exit 0 with the required metrics -> ok; the OOM pattern in the log -> oom;
// exit 0 without metrics -> error naming the missing metrics; otherwise error with the last line.
TrialOutcome classify_external(const Workload& workload, const SubprocessResult& proc, double timeout_s,
                               const std::string& log_text);

}  // namespace scalelab::lab
