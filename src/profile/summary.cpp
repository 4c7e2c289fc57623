#include "profile/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace scalelab::profile {

double Table::total() const {
  double t = 0;
  for (const auto& r : rows) t += r.total;
  return t;
}

const StatRow* Table::find(const std::string& name) const {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

const Table* Report::find(const std::string& id) const {
  for (const auto& t : tables)
    if (t.id == id) return &t;
  return nullptr;
}

StatRow stat_row(const std::string& name, std::vector<double> v) {
  StatRow r;
  r.name = name;
  r.instances = static_cast<std::int64_t>(v.size());
  if (v.empty()) return r;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  const std::size_t n = v.size();
  r.total = sum;
  r.avg = sum / static_cast<double>(n);
  r.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  r.min = v.front();
  r.max = v.back();
  if (n > 1) {
    double ss = 0;
    for (double x : v) ss += (x - r.avg) * (x - r.avg);
    r.stddev = std::sqrt(ss / static_cast<double>(n - 1));
  }
  return r;
}

void finalize_table(Table& t, bool recompute_percent) {
  std::sort(t.rows.begin(), t.rows.end(), [](const StatRow& a, const StatRow& b) {
    return a.total != b.total ? a.total > b.total : a.name < b.name;
  });
  if (!recompute_percent) return;
  const double total = t.total();
  for (auto& r : t.rows) r.percent = total > 0 ? 100.0 * r.total / total : 0.0;
}

Table table_from_samples(std::string id, std::string title, const std::map<std::string, std::vector<double>>& samples) {
  Table t;
  t.id = std::move(id);
  t.title = std::move(title);
  for (const auto& [name, v] : samples) t.rows.push_back(stat_row(name, v));
  finalize_table(t);
  return t;
}

std::vector<Interval> merge_intervals(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const auto& i : v) {
    if (i.end <= i.start) continue;
    if (!out.empty() && i.start <= out.back().end) {
      out.back().end = std::max(out.back().end, i.end);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double covered(const std::vector<Interval>& merged) {
  double t = 0;
  for (const auto& i : merged) t += i.end - i.start;
  return t;
}

double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double t = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].start, b[j].start), hi = std::min(a[i].end, b[j].end);
    if (hi > lo) t += hi - lo;
    if (a[i].end < b[j].end) ++i;
    else ++j;
  }
  return t;
}

Format parse_format(const std::string& name) {
  if (name == "md" || name == "markdown") return Format::kMarkdown;
  if (name == "csv") return Format::kCsv;
  if (name == "json") return Format::kJson;
  throw InvalidInput("[--format] '" + name + "' is not a summary format — use md, csv or json");
}

namespace {

// 1234567.8 -> "1,234,568" (nsys's grouping); MB figures keep three decimals.
std::string grouped(double v, const std::string& unit) {
  char buf[64];
  if (unit != "ns") {
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.0f", std::round(v));
  std::string s = buf, out;
  const bool neg = !s.empty() && s[0] == '-';
  if (neg) s.erase(0, 1);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return neg ? "-" + out : out;
}

std::string plain(double v, const std::string& unit) {
  char buf[64];
  if (unit != "ns") std::snprintf(buf, sizeof buf, "%.3f", v);
  else std::snprintf(buf, sizeof buf, "%.0f", std::round(v));
  return buf;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

std::string derived_value(const nlohmann::json& v) {
  if (v.is_number_float()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v.get<double>());
    return buf;
  }
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace

std::string render_markdown(const Report& r, std::size_t max_rows) {
  std::ostringstream o;
  o << "# Profile summary: " << r.file << " (" << r.source << ")\n";
  for (const auto& t : r.tables) {
    const std::string u = t.unit;
    o << "\n## " << t.title << "\n\n";
    if (t.rows.empty()) {
      o << "(no events)\n";
      continue;
    }
    o << "| Time (%) | Total (" << u << ") | Instances | Avg (" << u << ") | Med (" << u << ") | Min (" << u
      << ") | Max (" << u << ") | StdDev (" << u << ") | Name |\n";
    o << "|---:|---:|---:|---:|---:|---:|---:|---:|:---|\n";
    std::size_t shown = 0;
    for (const auto& row : t.rows) {
      if (max_rows > 0 && shown == max_rows) {
        o << "| | | | | | | | | (" << t.rows.size() - max_rows << " more rows: `scalelab profile-summary` on the trace, or the run record) |\n";
        break;
      }
      ++shown;
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.1f", row.percent);
      o << "| " << pct << " | " << grouped(row.total, u) << " | " << row.instances << " | " << grouped(row.avg, u)
        << " | " << grouped(row.med, u) << " | " << grouped(row.min, u) << " | " << grouped(row.max, u) << " | "
        << grouped(row.stddev, u) << " | " << md_cell(row.name) << " |\n";
    }
  }
  if (!r.derived.empty()) {
    o << "\n## Derived\n\n| Figure | Value |\n|:---|---:|\n";
    for (const auto& [k, v] : r.derived.items()) o << "| " << k << " | " << derived_value(v) << " |\n";
  }
  for (const auto& n : r.notes) o << "\nNote: " << n << "\n";
  return o.str();
}

std::string render_csv(const Report& r) {
  std::ostringstream o;
  o << "Table,Unit,Time (%),Total,Instances,Avg,Med,Min,Max,StdDev,Name\n";
  for (const auto& t : r.tables) {
    for (const auto& row : t.rows) {
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.1f", row.percent);
      o << csv_field(t.id) << ',' << t.unit << ',' << pct << ',' << plain(row.total, t.unit) << ',' << row.instances
        << ',' << plain(row.avg, t.unit) << ',' << plain(row.med, t.unit) << ',' << plain(row.min, t.unit) << ','
        << plain(row.max, t.unit) << ',' << plain(row.stddev, t.unit) << ',' << csv_field(row.name) << '\n';
    }
  }
  return o.str();
}

nlohmann::json to_json(const Report& r) {
  nlohmann::json tables = nlohmann::json::array();
  for (const auto& t : r.tables) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : t.rows) {
      rows.push_back({{"name", row.name},
                      {"time_percent", row.percent},
                      {"total", row.total},
                      {"instances", row.instances},
                      {"avg", row.avg},
                      {"med", row.med},
                      {"min", row.min},
                      {"max", row.max},
                      {"stddev", row.stddev}});
    }
    tables.push_back({{"id", t.id}, {"title", t.title}, {"unit", t.unit}, {"rows", rows}});
  }
  return {{"source", r.source}, {"file", r.file}, {"tables", tables}, {"derived", r.derived}, {"notes", r.notes}};
}

Report report_from_json(const nlohmann::json& j) {
  Report r;
  r.source = j.value("source", std::string());
  r.file = j.value("file", std::string());
  for (const auto& t : j.value("tables", nlohmann::json::array())) {
    Table tab;
    tab.id = t.value("id", std::string());
    tab.title = t.value("title", std::string());
    tab.unit = t.value("unit", std::string("ns"));
    for (const auto& row : t.value("rows", nlohmann::json::array())) {
      StatRow s;
      s.name = row.value("name", std::string());
      s.percent = row.value("time_percent", 0.0);
      s.total = row.value("total", 0.0);
      s.instances = row.value("instances", std::int64_t{0});
      s.avg = row.value("avg", 0.0);
      s.med = row.value("med", 0.0);
      s.min = row.value("min", 0.0);
      s.max = row.value("max", 0.0);
      s.stddev = row.value("stddev", 0.0);
      tab.rows.push_back(s);
    }
    r.tables.push_back(std::move(tab));
  }
  r.derived = j.value("derived", nlohmann::json::object());
  for (const auto& n : j.value("notes", nlohmann::json::array())) r.notes.push_back(n.get<std::string>());
  return r;
}

std::string render(const Report& r, Format f) {
  switch (f) {
    case Format::kMarkdown: return render_markdown(r);
    case Format::kCsv: return render_csv(r);
    case Format::kJson: return to_json(r).dump(2) + "\n";
  }
  return "";
}

}  // namespace scalelab::profile
