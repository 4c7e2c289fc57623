#pragma once
// For a `scalelab scale` study (a sweep of kind "scale"): the study's own table (lab/scale.h:
// per-device and total throughput, speedup, efficiency, cost efficiency, cost per 1M tokens with a
// price, J/token with telemetry, Karp–Flatt, and the recommendations per purpose) added to the
// analysis as "scale_study" and scale.csv, so the report shows cost and energy per device count.
#include <string>

#include "analysis/analyze.h"

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

// Does nothing for other kinds of sweep.
void add_scale_study(Analysis& a, const lab::ResultsStore& store, const std::string& sweep);

}  // namespace scalelab::analysis
