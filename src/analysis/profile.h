#pragma once
// Profiles in the analysis (the profiling issue's "report card"): for a sweep whose trials were
// profiled (native `--profile`, or an external workload's [workload] profile = "nsys" / "torch"),
// the per-trial split of time by op family (or GPU kernel) and the derived figures side by side —
// the same tables as `scalelab results --view profile` and `--view profile-compare`
// (lab/views.h), as analysis.json's "profile" section and two CSVs. The report draws the split as
// stacked bars per trial and prints the comparison as a table.
#include <string>

#include "analysis/analyze.h"

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

// Adds a.json["profile"] = {"ops": {columns, rows, notes}, "compare": {...}} and the tables
// "profile" and "profile_compare" when at least one trial of the sweep holds a profile summary;
// nothing otherwise.
void add_profile(Analysis& a, const lab::ResultsStore& store, const std::string& sweep);

}  // namespace scalelab::analysis
