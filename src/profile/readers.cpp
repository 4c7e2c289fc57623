#include "profile/readers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"
#include "model/tokenizer/utf8.h"

namespace scalelab::profile {
namespace {

using nlohmann::json;
using Samples = std::map<std::string, std::vector<double>>;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

double num(const json& j, const char* key, double fallback = 0) {
  if (!j.contains(key)) return fallback;
  const json& v = j[key];
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    try {
      return std::stod(v.get<std::string>());
    } catch (...) {
      return fallback;
    }
  }
  return fallback;
}

// What a trace or CSV figure may be: finite and at most 1e18 in magnitude (31 years in
// nanoseconds, 11,574 days in microseconds; 1 EB as bytes). Larger values, "inf" or "nan" only
// come from a corrupt file, and would make sums infinite, which JSON (a run record's
// profile.summary, --format json) cannot hold.
constexpr double kMaxFigure = 1e18;

// The numeric field `key` of event `e` (see num), refused with InvalidInput naming `source` and
// the event when it is not finite or beyond kMaxFigure.
double figure(const json& e, const char* key, const std::string& source) {
  const double v = num(e, key);
  if (!(std::fabs(v) <= kMaxFigure)) {
    throw InvalidInput("[profile-summary] " + source + ": event '" + (e.contains("name") ? e["name"].dump() : "?") +
                       "' has " + key + " = " + (e[key].is_string() ? e[key].get<std::string>() : e[key].dump()) +
                       ", not a finite figure of at most 1e18 — the trace is corrupt; re-export it");
  }
  return v;
}

std::string str(const json& j, const char* key, const std::string& fallback = "") {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return fallback;
  return j[key].get<std::string>();
}

// The integer field `key` of `j` when it is an integer that fits an int, else `fallback`. Other
// tools write strings where scalelab writes numbers ("tid": "main"), and json::value<int> would
// throw on those and cast a float such as 1e300 to int (undefined behaviour).
int int_or(const json& j, const char* key, int fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return fallback;
  const json& v = j[key];
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    return u <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()) ? static_cast<int>(u) : fallback;
  }
  const auto x = v.get<std::int64_t>();
  return x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max() ? static_cast<int>(x) : fallback;
}

bool bool_or(const json& j, const char* key, bool fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_boolean()) return fallback;
  return j[key].get<bool>();
}

int pid_of(const json& e) {
  if (!e.contains("pid")) return 0;
  if (e["pid"].is_number_integer()) return e["pid"].get<int>();
  return static_cast<int>(std::hash<std::string>{}(e["pid"].dump()) & 0x7fffffff);
}

const json& events_of(const json& trace) {
  static const json empty = json::array();
  if (trace.is_array()) return trace;
  if (trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array()) return trace["traceEvents"];
  return empty;
}

void add_table(Report& r, const char* id, const char* title, const Samples& s, bool keep_empty = false) {
  if (s.empty() && !keep_empty) return;
  r.tables.push_back(table_from_samples(id, title, s));
}

// GPU activity as PyTorch's profiler and scalelab's CUPTI backend write it (Chrome trace events
// of category kernel / cuda_runtime / cuda_driver / gpu_memcpy / gpu_memset): the tables and the
// derived figures both readers share.
struct GpuActivity {
  // PyTorch's reader: table "communication" and comm_* figures; scalelab's, where "communication"
  // is the DDP engine's own: "nccl_kernels" and nccl_comm_*.
  std::string comm_table = "communication", comm_prefix;
  Samples kernels, api, memops, nccl;
  std::map<int, std::vector<Interval>> busy, compute, comm;
  std::map<std::string, double> bytes;
  double launch_us = 0, sync_us = 0;

  // Takes the event when its category is GPU activity; returns whether it did.
  bool add(const std::string& cat, const std::string& name, const json& e, int pid, double ts, double dur,
           const std::string& source) {
    const double ns = dur * 1e3;
    if (cat == "kernel") {
      kernels[name].push_back(ns);
      busy[pid].push_back({ts, ts + dur});
      if (contains(lower(name), "nccl")) {
        nccl[name].push_back(ns);
        comm[pid].push_back({ts, ts + dur});
      } else {
        compute[pid].push_back({ts, ts + dur});
      }
      return true;
    }
    if (cat == "cuda_runtime" || cat == "cuda_driver") {
      api[name].push_back(ns);
      if (contains(name, "LaunchKernel")) launch_us += dur;
      if (contains(name, "Synchronize")) sync_us += dur;
      return true;
    }
    if (cat == "gpu_memcpy" || cat == "gpu_memset") {
      memops[name].push_back(ns);
      busy[pid].push_back({ts, ts + dur});
      const json args = e.value("args", json::object());
      if (args.contains("bytes")) bytes[name] += figure(args, "bytes", source);
      return true;
    }
    return false;
  }

  void finish(Report& r) {
    add_table(r, "kernels", "GPU kernels", kernels);
    add_table(r, "cuda_api", "CUDA API (runtime and driver)", api);
    add_table(r, "gpu_memory_ops", "GPU memory operations (memcpy / memset by kind)", memops);
    add_table(r, comm_table.c_str(), "Communication (NCCL kernels)", nccl);
    if (!busy.empty()) {
      double span = 0, covered_us = 0;
      for (auto& [pid, v] : busy) {
        const auto m = merge_intervals(v);
        if (m.empty()) continue;  // only activity of zero duration (a trace in whole µs has them)
        span += m.back().end - m.front().start;
        covered_us += covered(m);
      }
      r.derived["device_busy_s"] = covered_us * 1e-6;
      r.derived["device_span_s"] = span * 1e-6;
      r.derived["device_idle_fraction"] = span > 0 ? 1.0 - covered_us / span : 0.0;
    }
    if (!api.empty()) {
      r.derived["launch_api_s"] = launch_us * 1e-6;
      r.derived["sync_api_s"] = sync_us * 1e-6;
    }
    if (!comm.empty()) {
      double total = 0, hidden = 0;
      for (auto& [pid, v] : comm) {
        const auto c = merge_intervals(v);
        total += covered(c);
        hidden += overlap(c, merge_intervals(compute[pid]));
      }
      r.derived[comm_prefix + "comm_time_s"] = total * 1e-6;
      r.derived[comm_prefix + "comm_hidden_s"] = hidden * 1e-6;
      r.derived[comm_prefix + "comm_exposed_s"] = (total - hidden) * 1e-6;
      r.derived[comm_prefix + "comm_hidden_fraction"] = total > 0 ? hidden / total : 0.0;
    }
    for (const auto& [name, b] : bytes) r.derived["bytes " + name] = b;
  }
};

}  // namespace

Report summarize_scalelab_trace(const json& trace, bool all_steps, const std::string& source) {
  Report r;
  r.source = "scalelab";
  const json other = trace.is_object() && trace.contains("otherData") && trace["otherData"].is_object()
                         ? trace["otherData"]
                         : json::object();
  // Where each rank's measured steps begin (microseconds on the file's time base).
  std::map<int, double> from;
  if (!all_steps) {
    if (other.contains("inputs")) {
      for (const auto& in : other["inputs"]) {
        if (in.contains("measured_from_us"))
          from[int_or(in, "rank", 0)] = num(in, "measured_from_us") + num(in, "shift_us");
      }
    } else if (other.contains("measured_from_us")) {
      from[int_or(other, "rank", 0)] = num(other, "measured_from_us");
    }
  }
  Samples ops, op_phases, regions, layers, comm;
  std::map<int, std::vector<Interval>> allreduce, waits;
  std::map<std::pair<int, int>, std::vector<Interval>> op_spans;
  std::vector<double> steps;
  GpuActivity gpu;  // CUPTI's records (CUDA runs with --trace / --profile)
  gpu.comm_table = "nccl_kernels";
  gpu.comm_prefix = "nccl_";
  for (const auto& e : events_of(trace)) {
    if (str(e, "ph") != "X") continue;
    const int pid = pid_of(e);
    const double ts = figure(e, "ts", source), dur = figure(e, "dur", source);
    if (auto it = from.find(pid); it != from.end() && ts + 1e-3 < it->second) continue;
    const std::string cat = str(e, "cat"), name = str(e, "name");
    const json args = e.value("args", json::object());
    const std::string phase = str(args, "phase");
    const double ns = dur * 1e3;
    if (gpu.add(cat, name, e, pid, ts, dur, source)) continue;
    if (cat == "op") {
      ops[name].push_back(ns);
      op_phases[phase.empty() ? name : name + " (" + phase + ")"].push_back(ns);
      op_spans[{pid, int_or(e, "tid", 0)}].push_back({ts, ts + dur});
    } else if (cat == "step") {
      regions["step"].push_back(ns);
      steps.push_back(dur * 1e-6);
    } else if (cat == "phase") {
      regions[name].push_back(ns);
    } else if (cat == "layer") {
      layers[phase.empty() ? name : name + " (" + phase + ")"].push_back(ns);
    } else if (cat == "comm") {
      comm[name].push_back(ns);
      // The collectives as the communication engine ran them (DDP's all-reduce; ZeRO-1's blocking
      // reduce-scatter and gather) and the step's waits for them.
      if (name == "all_reduce" || name == "reduce_scatter" || name == "update + all_gather")
        allreduce[pid].push_back({ts, ts + dur});
      if (name == "ddp wait" || name == "zero wait") waits[pid].push_back({ts, ts + dur});
    }
  }
  const std::string op_timing = str(other, "op_timing");
  const std::string op_title = op_timing.rfind("device queue", 0) == 0
                                   ? "Op families (device time between each op front's first and last kernel, CUDA events)"
                               : op_timing.empty() ? "Op families (host time of each op front)"
                                                   : "Op families (host time of each op front, synchronized per scope)";
  add_table(r, "op_families", op_title.c_str(), ops, true);
  add_table(r, "op_phases", "Op families by phase", op_phases);
  add_table(r, "regions", "Steps and phases", regions);
  add_table(r, "layers", "Layers", layers);
  add_table(r, "communication", "Communication (all_reduce: as the communication engine ran it)", comm);

  double step_sum = 0;
  for (double s : steps) step_sum += s;
  r.derived["steps"] = steps.size();
  if (!steps.empty()) r.derived["step_time_median_s"] = stat_row("", steps).med;
  double op_union = 0;
  for (auto& [key, v] : op_spans) op_union += covered(merge_intervals(std::move(v)));
  if (step_sum > 0) r.derived["op_time_fraction_of_steps"] = op_union * 1e-6 / step_sum;
  if (!allreduce.empty()) {
    double total = 0, exposed = 0;
    for (auto& [pid, v] : allreduce) {
      const auto a = merge_intervals(v);
      total += covered(a);
      exposed += overlap(a, merge_intervals(waits[pid]));
    }
    r.derived["comm_time_s"] = total * 1e-6;
    r.derived["comm_exposed_s"] = exposed * 1e-6;
    r.derived["comm_hidden_s"] = (total - exposed) * 1e-6;
    r.derived["comm_hidden_fraction"] = total > 0 ? (total - exposed) / total : 0.0;
    r.notes.push_back("communication is hidden when the all-reduce ran while backward computed, exposed when it "
                      "ran while the step waited for it (the DDP wait)");
  }
  const bool have_gpu = !gpu.kernels.empty() || !gpu.api.empty();
  gpu.finish(r);
  if (have_gpu) {
    r.notes.push_back("GPU tables from CUPTI: " + str(other, "gpu_activity", "activity records") +
                      "; device_idle_fraction is the time between the first and last GPU activity with no "
                      "kernel or copy running (launch-bound when high)");
  } else if (other.contains("gpu_activity")) {
    r.notes.push_back("no GPU activity tables: " + str(other, "gpu_activity"));
  }
  if (int_or(other, "world_size", 1) > 1 || bool_or(other, "merged", false)) {
    r.notes.push_back("tables sum over every rank in the file");
  }
  if (!all_steps && !from.empty()) r.notes.push_back("measured steps only (after --bench-warmup-steps)");
  return r;
}

Report summarize_torch_trace(const json& trace, const std::string& source) {
  Report r;
  r.source = "pytorch";
  Samples cpu, annotations;
  GpuActivity gpu;
  for (const auto& e : events_of(trace)) {
    if (str(e, "ph") != "X") continue;
    std::string cat = lower(str(e, "cat"));
    // Older exports name the categories "Operator", "Kernel", "Runtime", "Memcpy", "Memset".
    if (cat == "operator") cat = "cpu_op";
    else if (cat == "runtime") cat = "cuda_runtime";
    else if (cat == "driver") cat = "cuda_driver";
    else if (cat == "memcpy") cat = "gpu_memcpy";
    else if (cat == "memset") cat = "gpu_memset";
    std::string name = str(e, "name");
    const double ts = figure(e, "ts", source), dur = figure(e, "dur", source), ns = dur * 1e3;
    const int pid = pid_of(e);
    if (cat == "cpu_op") {
      cpu[name].push_back(ns);
    } else if (cat == "user_annotation") {
      if (name.rfind("ProfilerStep#", 0) == 0) name = "ProfilerStep#*";
      annotations[name].push_back(ns);
    } else {
      gpu.add(cat, name, e, pid, ts, dur, source);
    }
  }
  add_table(r, "cpu_ops", "CPU ops (aten, nested ops counted in each)", cpu, true);
  add_table(r, "user_annotations", "User annotations", annotations);
  const bool no_kernels = gpu.kernels.empty();
  gpu.finish(r);
  if (no_kernels) r.notes.push_back("no GPU kernels in this trace (a CPU-only profile)");
  return r;
}

namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// The unit in "Total Time (ns)" / "Avg (MB)"; empty when none.
std::string unit_of(const std::string& col) {
  const auto a = col.rfind('('), b = col.rfind(')');
  if (a == std::string::npos || b == std::string::npos || b < a) return "";
  return col.substr(a + 1, b - a - 1);
}

std::string title_for(const std::string& id) {
  static const std::map<std::string, std::string> titles = {
      {"cuda_gpu_kern_sum", "CUDA GPU kernels"},
      {"cuda_api_sum", "CUDA API"},
      {"cuda_gpu_mem_time_sum", "CUDA GPU memory operations by time"},
      {"cuda_gpu_mem_size_sum", "CUDA GPU memory operations by size"},
      {"nvtx_sum", "NVTX ranges"},
      {"osrt_sum", "OS runtime"},
      {"nccl_sum", "NCCL"}};
  auto it = titles.find(id);
  return it == titles.end() ? id : it->second;
}

double to_double(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ','), s.end());
  if (s.empty()) return 0;
  try {
    return std::stod(s);
  } catch (...) {
    return 0;
  }
}

struct Columns {
  int pct = -1, total = -1, count = -1, avg = -1, med = -1, min = -1, max = -1, stddev = -1, name = -1;
  std::string unit;
  bool usable() const { return total >= 0 && name >= 0; }
};

Columns map_columns(const std::vector<std::string>& h) {
  Columns c;
  for (int i = 0; i < static_cast<int>(h.size()); ++i) {
    const std::string& col = h[static_cast<std::size_t>(i)];
    if (col.rfind("Time (%)", 0) == 0 || col.rfind("Time(%)", 0) == 0) c.pct = i;
    else if (col.rfind("Total", 0) == 0) {
      c.total = i;
      c.unit = unit_of(col);
    } else if (col == "Instances" || col == "Count" || col == "Num Calls" || col == "Calls") c.count = i;
    else if (col.rfind("Avg", 0) == 0) c.avg = i;
    else if (col.rfind("Med", 0) == 0) c.med = i;
    else if (col.rfind("Min", 0) == 0) c.min = i;
    else if (col.rfind("Max", 0) == 0) c.max = i;
    else if (col.rfind("StdDev", 0) == 0) c.stddev = i;
    else if (col == "Name" || col == "Operation" || col == "Range") c.name = i;
  }
  return c;
}

// " ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):" -> {"CUDA GPU Kernel Summary", "cuda_gpu_kern_sum"}
bool section_header(const std::string& line, std::string& title, std::string& id) {
  const auto star = line.find("** ");
  if (star == std::string::npos) return false;
  std::string rest = line.substr(star + 3);
  while (!rest.empty() && (rest.back() == ':' || rest.back() == ' ' || rest.back() == '\r')) rest.pop_back();
  const auto a = rest.rfind('('), b = rest.rfind(')');
  if (a != std::string::npos && b != std::string::npos && b > a) {
    id = rest.substr(a + 1, b - a - 1);
    title = rest.substr(0, a);
    while (!title.empty() && title.back() == ' ') title.pop_back();
  } else {
    id = rest;
    title = rest;
  }
  return true;
}

}  // namespace

Report summarize_nsys_csv(const std::string& raw_text, const std::string& name_hint) {
  // Names, titles and ids go into JSON (--format json, a run record's profile.summary), which
  // holds only UTF-8: a byte that is not (a Latin-1 kernel name) reads as U+FFFD, as Python reads
  // the file with errors="replace".
  const std::string text = tok::sanitize_utf8(raw_text);
  Report r;
  r.source = "nsys";
  std::string pending_id, pending_title;
  // nsys --output writes "<base>_<report>.csv": the report from the file name (not its directory).
  const auto slash = name_hint.find_last_of('/');
  const std::string file_name = slash == std::string::npos ? name_hint : name_hint.substr(slash + 1);
  for (const char* id : {"cuda_gpu_kern_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum",
                         "nvtx_sum", "osrt_sum", "nccl_sum"}) {
    if (contains(file_name, id)) pending_id = id;
  }
  Columns cols;
  Table* cur = nullptr;
  std::istringstream in(text);
  std::string line;
  int anonymous = 0;
  auto close = [&] {
    if (cur) finalize_table(*cur, cols.pct < 0);
    cur = nullptr;
  };
  std::size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string title, id;
    if (section_header(line, title, id)) {
      close();
      pending_id = id;
      pending_title = title;
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string::npos) {
      close();
      continue;
    }
    const auto f = split_csv_line(line);
    if (!cur) {
      const Columns c = map_columns(f);
      if (!c.usable()) continue;  // a line nsys prints around its reports ("Processing ...")
      cols = c;
      r.tables.emplace_back();
      cur = &r.tables.back();
      cur->id = pending_id.empty() ? "report_" + std::to_string(++anonymous) : pending_id;
      cur->title = pending_title.empty() ? title_for(cur->id) : pending_title;
      cur->unit = cols.unit.empty() ? "ns" : cols.unit;
      pending_id.clear();
      pending_title.clear();
      continue;
    }
    auto at = [&](int i) {
      if (i < 0 || i >= static_cast<int>(f.size())) return 0.0;
      const double v = to_double(f[static_cast<std::size_t>(i)]);
      SCALELAB_CHECK_INPUT(std::fabs(v) <= kMaxFigure,
                           "[profile-summary] " + name_hint + " line " + std::to_string(line_no) + ": '" +
                               f[static_cast<std::size_t>(i)] +
                               "' is not a finite figure of at most 1e18 — the CSV is corrupt; rerun nsys stats");
      return v;
    };
    StatRow row;
    row.name = cols.name < static_cast<int>(f.size()) ? f[static_cast<std::size_t>(cols.name)] : "";
    row.percent = at(cols.pct);
    row.total = at(cols.total);
    row.instances = static_cast<std::int64_t>(at(cols.count));
    row.avg = at(cols.avg);
    row.med = at(cols.med);
    row.min = at(cols.min);
    row.max = at(cols.max);
    row.stddev = at(cols.stddev);
    cur->rows.push_back(row);
  }
  close();
  SCALELAB_CHECK_INPUT(!r.tables.empty(),
                       "[profile-summary] " + (name_hint.empty() ? std::string("the input") : name_hint) +
                           " has no nsys stats table (a CSV header with \"Total Time (ns)\" and \"Name\") — pass the "
                           "output of `nsys stats --format csv`, a scalelab trace or a PyTorch profiler trace");
  // The reference study's figures: launch and synchronization calls, host-to-device copies, NCCL.
  double launch = 0, sync = 0, htod = 0, nccl = 0;
  bool have_api = false, have_mem = false, have_kern = false;
  for (const auto& t : r.tables) {
    if (t.unit != "ns") continue;
    for (const auto& row : t.rows) {
      if (t.id == "cuda_api_sum") {
        have_api = true;
        if (contains(row.name, "LaunchKernel")) launch += row.total;
        if (contains(row.name, "Synchronize")) sync += row.total;
      } else if (t.id == "cuda_gpu_mem_time_sum") {
        have_mem = true;
        if (contains(row.name, "Host-to-Device") || contains(row.name, "HtoD")) htod += row.total;
      } else if (t.id == "cuda_gpu_kern_sum") {
        have_kern = true;
        if (contains(lower(row.name), "nccl")) nccl += row.total;
      }
    }
  }
  if (have_api) {
    r.derived["launch_api_s"] = launch * 1e-9;
    r.derived["sync_api_s"] = sync * 1e-9;
  }
  if (have_mem) r.derived["memcpy_htod_s"] = htod * 1e-9;
  if (have_kern) r.derived["nccl_kernel_s"] = nccl * 1e-9;
  return r;
}

Report summarize_file(const std::string& path, bool all_steps) {
  const auto ends_with = [&](const char* ext) {
    const std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends_with(".nsys-rep") || ends_with(".qdrep") || ends_with(".sqlite")) {
    throw InvalidInput("[profile-summary] " + path +
                       " is an Nsight Systems report, which only nsys reads — run `nsys stats --format csv --report "
                       "cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,nvtx_sum " +
                       path + " > stats.csv` and pass stats.csv");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InvalidInput("[profile-summary] cannot read '" + path + "' — check the path");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const auto first = text.find_first_not_of(" \t\r\n");
  Report r;
  if (first != std::string::npos && (text[first] == '{' || text[first] == '[')) {
    json j;
    try {
      j = json::parse(text);
    } catch (const std::exception& e) {
      throw InvalidInput("[profile-summary] " + path + " is not valid JSON (" + e.what() +
                         ") — was the trace written completely?");
    }
    SCALELAB_CHECK_INPUT(j.is_array() || (j.is_object() && j.contains("traceEvents")),
                         "[profile-summary] " + path +
                             " is JSON but not a Chrome trace (no traceEvents) — pass a scalelab or PyTorch trace");
    const bool ours = j.is_object() && j.contains("otherData") && j["otherData"].is_object() &&
                      str(j["otherData"], "generator") == "scalelab";
    r = ours ? summarize_scalelab_trace(j, all_steps, path) : summarize_torch_trace(j, path);
  } else {
    r = summarize_nsys_csv(text, path);
  }
  r.file = tok::sanitize_utf8(path);  // JSON holds only UTF-8; a path need not be
  return r;
}

}  // namespace scalelab::profile
