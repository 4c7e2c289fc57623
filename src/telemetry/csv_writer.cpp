#include "telemetry/csv_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"

namespace scalelab {
namespace {

const std::vector<std::string>& known_metric_order() {
  static const std::vector<std::string> kOrder = {
      "gpu_util_pct",  "mem_util_pct",  "mem_total_bytes", "mem_used_bytes", "mem_reserved_bytes",
      "temperature_c", "power_w",       "energy_j",        "sm_clock_mhz",   "mem_clock_mhz",
      "pcie_tx_kb_s",  "pcie_rx_kb_s",  "clocks_event_reasons", "num_processes",
      "process_mem_used_bytes", "cpu_util_pct", "rss_bytes", "allocated_bytes", "reserved_bytes",
      "peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes"};
  return kOrder;
}

// RFC 4180 quoting where a cell needs it.
std::string cell(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string number(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", v);
  }
  return buf;
}

}  // namespace

std::vector<std::string> telemetry_csv_metric_columns(const std::vector<Sample>& samples) {
  std::set<std::string> present;
  for (const auto& s : samples) present.insert(s.metric);
  std::vector<std::string> cols;
  for (const auto& m : known_metric_order())
    if (present.erase(m)) cols.push_back(m);
  cols.insert(cols.end(), present.begin(), present.end());  // the rest, alphabetically
  return cols;
}

void write_telemetry_csv(const std::vector<Sample>& samples, std::ostream& out) {
  const auto cols = telemetry_csv_metric_columns(samples);
  std::map<std::string, std::size_t> col_index;
  for (std::size_t i = 0; i < cols.size(); ++i) col_index[cols[i]] = i;

  out << "t_s,source,device";
  for (const auto& c : cols) out << ',' << cell(c);
  out << '\n';

  // Group the readings of one (instant, source, device) into a row, rows in time order.
  using RowKey = std::tuple<double, std::string, std::string>;
  std::map<RowKey, std::vector<std::string>> rows;
  for (const auto& s : samples) {
    auto& row = rows[RowKey{s.t_s, s.source, s.device}];
    if (row.empty()) row.resize(cols.size());
    row[col_index[s.metric]] = number(s.value);
  }
  char tbuf[32];
  for (const auto& [key, row] : rows) {
    std::snprintf(tbuf, sizeof tbuf, "%.3f", std::get<0>(key));
    out << tbuf << ',' << cell(std::get<1>(key)) << ',' << cell(std::get<2>(key));
    for (const auto& v : row) out << ',' << v;
    out << '\n';
  }
}

void write_telemetry_csv(const std::vector<Sample>& samples, const std::string& path) {
  std::ofstream f(path);
  if (!f)
    throw InvalidInput("[telemetry] cannot write the CSV file " + path +
                       " — check that its directory exists and is writable");
  write_telemetry_csv(samples, f);
  f.close();
  if (!f)
    throw InvalidInput("[telemetry] writing " + path + " failed (disk full?) — free space or pick another path");
}

}  // namespace scalelab
