#pragma once
// The time series as CSV: one row per sample per device (all metrics a source read from one
// device at one instant), with the source in a column:
//   t_s,source,device,gpu_util_pct,mem_util_pct,mem_used_bytes,...
// Metric columns are the union over the file, in a fixed order (GPU fields first, then process,
// host and engine ones, then any other alphabetically); a metric a row lacks is an empty cell.
#include <ostream>
#include <string>
#include <vector>

#include "telemetry/time_series.h"

namespace scalelab {

void write_telemetry_csv(const std::vector<Sample>& samples, std::ostream& out);
// Throws InvalidInput when the file cannot be written.
void write_telemetry_csv(const std::vector<Sample>& samples, const std::string& path);

// The column order used for metrics (known ones first).
std::vector<std::string> telemetry_csv_metric_columns(const std::vector<Sample>& samples);

}  // namespace scalelab
