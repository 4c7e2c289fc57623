#pragma once
// `--baseline OTHER` (#12): the sweep against another sweep, joined on the configuration (the
// same parameters, hence the same config hash). For each target and configuration in both, over
// their successful trials (repeats):
//   ratio = mean(current) / mean(baseline);
//   95 % interval by the delta method on the log ratio: se = sqrt(s_c^2/(n_c m_c^2) + s_b^2/(n_b m_b^2))
//   (s: sd with ddof 1 over the repeats), ratio x exp(±1.96 se); without repeats on both sides
//   there is no interval;
//   a regression when the interval lies wholly on the bad side of 1 (or, without an interval, the
//   ratio is more than 5 % on the bad side). The bad side is "lower" for throughput-like targets
//   and "higher" for targets whose name has loss, time, bytes, gib or memory in it.
#include <string>
#include <vector>

#include "analysis/analyze.h"

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

// True when lower values of the metric are better (loss, time, memory).
bool lower_is_better(const std::string& metric);

// The "baseline" section and its table (baseline.csv). InvalidInput when the baseline sweep does
// not exist; a note (no rows) when no configuration is in both.
void add_baseline(Analysis& a, const lab::ResultsStore& store, const std::string& sweep, const std::string& baseline,
                  const std::vector<std::string>& targets);

}  // namespace scalelab::analysis
