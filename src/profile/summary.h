#pragma once
// Profile summaries shaped like `nsys stats`: one table per kind of activity, one row per name,
// with the columns Nsight Systems users read (Time (%), Total Time, Instances, Avg, Med, Min, Max,
// StdDev, Name), plus derived figures (communication hidden behind computation vs exposed, device
// idle time between kernels, time in launch and synchronization calls).
//
// The same tables come from three sources (profile/readers.h): scalelab's own trace
// (`train --trace` / `--profile`), a PyTorch profiler Chrome trace (export_chrome_trace), and the
// CSV that `nsys stats --format csv` prints. Times are nanoseconds, as nsys prints them.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab::profile {

struct StatRow {
  std::string name;
  double percent = 0;  // of the table's total
  double total = 0;
  std::int64_t instances = 0;
  double avg = 0, med = 0, min = 0, max = 0, stddev = 0;
};

struct Table {
  std::string id;     // "op_families", "kernels", "cuda_api", ... (stable, for scripts)
  std::string title;  // what a reader sees
  std::string unit = "ns";  // "ns", or "MB" for nsys's memory-size reports
  std::vector<StatRow> rows;
  double total() const;
  const StatRow* find(const std::string& name) const;
};

struct Report {
  std::string source;  // "scalelab", "pytorch", "nsys"
  std::string file;
  std::vector<Table> tables;
  nlohmann::json derived = nlohmann::json::object();
  std::vector<std::string> notes;
  const Table* find(const std::string& id) const;
};

// Statistics of a set of samples: avg, median (mean of the middle two for an even count), min,
// max, sample standard deviation (n - 1; 0 for a single sample), as nsys computes them.
StatRow stat_row(const std::string& name, std::vector<double> samples);
// A table from samples per name: rows by total, descending (ties by name); Time (%) of the
// table's total.
Table table_from_samples(std::string id, std::string title, const std::map<std::string, std::vector<double>>& samples);
// Sorts the rows and fills Time (%) (tables whose rows were given, e.g. read from nsys CSV, keep
// their own percentages when `recompute_percent` is false).
void finalize_table(Table& t, bool recompute_percent = true);

// Intervals [start, end) and the length of their union / their overlap with another set.
struct Interval {
  double start = 0, end = 0;
};
std::vector<Interval> merge_intervals(std::vector<Interval> v);  // sorted, disjoint
double covered(const std::vector<Interval>& merged);
double overlap(const std::vector<Interval>& merged_a, const std::vector<Interval>& merged_b);

enum class Format { kMarkdown, kCsv, kJson };
Format parse_format(const std::string& name);  // md|markdown, csv, json; InvalidInput otherwise

// Markdown: a heading and a table per Table, derived figures and notes after.
// max_rows > 0: at most that many rows per table, then a line saying how many were left out.
std::string render_markdown(const Report& r, std::size_t max_rows = 0);
// CSV: one header row, "Table" first, then nsys's columns with units; one row per table row.
std::string render_csv(const Report& r);
nlohmann::json to_json(const Report& r);
// The inverse of to_json (a run record's profile.summary back into tables).
Report report_from_json(const nlohmann::json& j);
std::string render(const Report& r, Format f);

}  // namespace scalelab::profile
