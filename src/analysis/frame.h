#pragma once
// The data table every analysis reads: one row per configuration that ran (repeats averaged, their
// spread kept), columns typed automatically.
//
//   numeric      numbers (strings that all read as numbers count too); a column of positive
//                integer powers of two with >= 3 distinct values is flagged log2_axis (charts)
//   binary       booleans, or text with exactly two levels (value 1 = the second level in
//                sorted order)
//   categorical  text with three or more levels; one-hot indicators "name=level" for association
//                (all levels), k-1 for regression (the first level in sorted order is the base)
// Columns that take one value over all rows are dropped and listed (dropped_constant).
// Column names are sanitized: every character outside [A-Za-z0-9_.=-] becomes '_', nothing is
// stripped from either end; two names that collide after that get a suffix "_2", "_3", ...
//
// From the results database (build_frame_from_sweep): the sweep's current trials with status ok
// are grouped by config hash; parameters come from the config, outcomes from the metrics (every
// numeric metric), telemetry as tel.<source>.<metric>.{avg,max,p95} over the steady window (the
// samples after the first 10 % of the trial's sampled span; all samples when fewer than 10),
// pooled over devices; scaling columns where a "ranks" parameter varies: speedup S = T(n)/T(b)
// (T: tokens_per_s, total), efficiency_pct = 100 S / p, karp_flatt = (1/S - 1/p)/(1 - 1/p) for
// p = n/b > 1, against the fewest-ranks row b with the same other parameters.
// From a CSV file (build_frame_from_csv): the header names the columns; every row must have as
// many cells; empty cells, "nan", "NaN", "NA" are missing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::lab {
class ResultsStore;
}

namespace scalelab::analysis {

using Json = nlohmann::json;

enum class ColumnKind { kNumeric, kBinary, kCategorical };
enum class ColumnRole { kParameter, kOutcome, kTelemetry, kScaling, kOther };
const char* kind_name(ColumnKind k);  // "numeric", "binary", "categorical"
const char* role_name(ColumnRole r);  // "parameter", "outcome", "telemetry", "scaling", "other"

struct Column {
  std::string name;    // sanitized
  std::string source;  // as found (parameter / metric / CSV header)
  ColumnKind kind = ColumnKind::kNumeric;
  ColumnRole role = ColumnRole::kOther;
  std::vector<double> values;       // numeric and binary (0/1); NaN = missing
  std::vector<std::string> text;    // binary and categorical: the label per row ("" = missing)
  std::vector<std::string> levels;  // binary and categorical, sorted
  std::vector<double> spread;       // sd (ddof=1) over the repeats of the row; NaN with one repeat
  bool log2_axis = false;
};

struct Frame {
  std::string source;                   // "sweep NAME (DB)" or "CSV PATH"
  std::vector<std::string> row_labels;  // one per row
  std::vector<int> repeats;             // trials averaged into each row
  std::vector<std::vector<std::int64_t>> row_trials;  // a sweep's trial ids per row (empty for a CSV)
  std::vector<Column> columns;
  std::vector<std::string> dropped_constant;
  std::vector<std::string> dropped_missing;  // of those, the columns with no value at all (every cell missing)
  std::vector<std::string> notes;       // trials left out and why, ...

  std::size_t rows() const { return row_labels.size(); }
  const Column* find(const std::string& name) const;
  Json to_json() const;  // columns with kinds, roles and values (null for missing)
};

// The sanitized column name (see above).
std::string sanitize_name(const std::string& name);

// A column of raw cells (JSON scalars or null) typed as above.
Column type_column(const std::string& name, const std::vector<Json>& cells, ColumnRole role);

// Drops the columns that are constant (missing cells ignored; an all-missing column counts as
// constant), recording their names.
void drop_constant_columns(Frame& frame);

// InvalidInput when the sweep does not exist or has no successful trial.
Frame build_frame_from_sweep(const lab::ResultsStore& store, const std::string& sweep);
// InvalidInput for a missing file, no header, no data rows, or a row with the wrong cell count
// (naming the line).
Frame build_frame_from_csv(const std::string& path);

}  // namespace scalelab::analysis
