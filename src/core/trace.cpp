#include "core/trace.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"

namespace scalelab {
namespace {

std::atomic<std::uint64_t> g_tracer_serial{1};

// The calling thread's tid under the tracer of a given serial (a thread records under one tracer
// at a time; a new tracer gives every thread a fresh id).
struct ThreadTid {
  std::uint64_t serial = 0;
  int tid = -1;
};
thread_local ThreadTid t_tid;

}  // namespace

Tracer::Tracer(TraceMeta meta, std::size_t max_events)
    : meta_(std::move(meta)), max_events_(max_events), origin_(Clock::now()), serial_(g_tracer_serial.fetch_add(1)) {
  origin_unix_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  t_tid = {serial_, kMainTid};
  events_.reserve(std::min<std::size_t>(max_events_, 1 << 16));
}

int Tracer::this_tid() {
  if (t_tid.serial != serial_) t_tid = {serial_, next_tid_.fetch_add(1)};
  return t_tid.tid;
}

void Tracer::push(Event&& e) {
  std::lock_guard<std::mutex> lk(mu_);
  if (events_.size() >= max_events_) {
    dropped_.fetch_add(1);
    return;
  }
  events_.push_back(std::move(e));
}

void Tracer::complete(std::string name, const char* cat, Clock::time_point start, Clock::time_point end,
                      const char* phase, std::int64_t index, std::int64_t bytes, int tid) {
  Event e;
  e.name = std::move(name);
  e.cat = cat;
  e.phase = phase;
  e.ts = us(start);
  e.dur = std::max(0.0, us(end) - e.ts);
  e.index = index;
  e.bytes = bytes;
  e.tid = tid < 0 ? this_tid() : tid;
  e.ph = 'X';
  push(std::move(e));
}

void Tracer::complete_us(std::string name, const char* cat, double ts_us, double dur_us, int tid, const char* phase,
                         std::int64_t index, std::int64_t bytes) {
  Event e;
  e.name = std::move(name);
  e.cat = cat;
  e.phase = phase;
  e.ts = ts_us;
  e.dur = std::max(0.0, dur_us);
  e.index = index;
  e.bytes = bytes;
  e.tid = tid;
  e.ph = 'X';
  push(std::move(e));
}

int Tracer::track(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  for (std::size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return kFirstTrackTid + static_cast<int>(i);
  }
  tracks_.push_back(name);
  return kFirstTrackTid + static_cast<int>(tracks_.size() - 1);
}

void Tracer::counter(const char* name, Clock::time_point t, const char* key1, double v1, const char* key2,
                     double v2) {
  Event e;
  e.name = name;
  e.cat = "counter";
  e.ts = us(t);
  e.key1 = key1;
  e.v1 = v1;
  e.key2 = key2;
  e.v2 = v2;
  e.tid = kMainTid;
  e.ph = 'C';
  push(std::move(e));
}

void Tracer::instant(std::string name, const char* cat, Clock::time_point t) {
  Event e;
  e.name = std::move(name);
  e.cat = cat;
  e.ts = us(t);
  e.tid = this_tid();
  e.ph = 'i';
  push(std::move(e));
}

void Tracer::set_other(const std::string& key, nlohmann::json value) {
  std::lock_guard<std::mutex> lk(mu_);
  other_[key] = std::move(value);
}

std::size_t Tracer::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_.size();
}

nlohmann::json Tracer::to_json() const {
  using nlohmann::json;
  std::lock_guard<std::mutex> lk(mu_);
  json ev = json::array();
  const int pid = meta_.rank;
  std::string pname = "rank " + std::to_string(meta_.rank) + " \xC2\xB7 " + meta_.device;
  if (!meta_.description.empty()) pname += " (" + meta_.description + ")";
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", pname}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
  std::set<int> tids{kMainTid};
  for (const auto& e : events_) tids.insert(e.tid);
  for (std::size_t i = 0; i < tracks_.size(); ++i) tids.insert(kFirstTrackTid + static_cast<int>(i));
  for (int tid : tids) {
    const std::size_t track = static_cast<std::size_t>(tid - kFirstTrackTid);
    const std::string tname = tid == kMainTid                                 ? "main"
                              : tid == kCommTid                               ? "communication"
                              : tid >= kFirstTrackTid && track < tracks_.size() ? tracks_[track]
                                                                              : "thread " + std::to_string(tid);
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", tname}}}});
    ev.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
  }
  for (const auto& e : events_) {
    json j = {{"ph", std::string(1, e.ph)}, {"name", e.name}, {"cat", e.cat}, {"pid", pid}, {"tid", e.tid}, {"ts", e.ts}};
    if (e.ph == 'X') {
      j["dur"] = e.dur;
      json args = json::object();
      if (e.phase) args["phase"] = e.phase;
      if (e.index >= 0) args["index"] = e.index;
      if (e.bytes >= 0) args["bytes"] = e.bytes;
      if (!args.empty()) j["args"] = std::move(args);
    } else if (e.ph == 'C') {
      json args = {{e.key1, e.v1}};
      if (e.key2) args[e.key2] = e.v2;
      j["args"] = std::move(args);
    } else if (e.ph == 'i') {
      j["s"] = "t";
    }
    ev.push_back(std::move(j));
  }
  json other = meta_.extra.is_object() ? meta_.extra : json::object();
  other["generator"] = "scalelab";
  other["rank"] = meta_.rank;
  other["world_size"] = meta_.world_size;
  other["device"] = meta_.device;
  other["device_description"] = meta_.description;
  other["origin_unix_us"] = origin_unix_us_;
  other["dropped_events"] = dropped_.load();
  for (const auto& [k, v] : other_.items()) other[k] = v;
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

void Tracer::write(const std::string& path) const {
  const nlohmann::json j = to_json();
  const std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw RuntimeError("[--trace] cannot write '" + path + "' — check the directory exists and is writable");
    out << j.dump() << "\n";
    if (!out) throw RuntimeError("[--trace] writing '" + path + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw RuntimeError("[--trace] cannot move the trace into '" + path + "': " + ec.message());
}

std::string trace_path_for_rank(const std::string& path, int rank, int world_size) {
  if (world_size <= 1) return path;
  const std::string tag = ".rank" + std::to_string(rank);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1 ||
      (slash == std::string::npos && dot == 0)) {
    return path + tag;
  }
  return path.substr(0, dot) + tag + path.substr(dot);
}

nlohmann::json merge_traces(const std::vector<nlohmann::json>& traces, const std::vector<std::string>& names) {
  using nlohmann::json;
  SCALELAB_CHECK_INPUT(!traces.empty(), "[trace merge] no traces to merge — pass the files of every rank");
  const auto name_of = [&](std::size_t i) {
    return i < names.size() ? names[i] : "input " + std::to_string(i + 1);
  };
  // What this reads of a file, checked (each file comes from outside: a type error or an
  // overflowing origin would otherwise end in a library exception or undefined behaviour).
  // Origins are microseconds on the wall clock: at most 2^53 (285 years) either side of 1970.
  constexpr std::int64_t kMaxOrigin = std::int64_t{1} << 53;
  std::int64_t origin = 0;
  bool first = true;
  std::set<int> ranks;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const json& t = traces[i];
    const std::string where = "[trace merge] " + name_of(i);
    SCALELAB_CHECK_INPUT(t.is_object() && t.contains("traceEvents") && t["traceEvents"].is_array() &&
                             t.contains("otherData") && t["otherData"].is_object() &&
                             t["otherData"].value("generator", json()) == "scalelab",
                         where + " is not a scalelab trace (no traceEvents array and otherData.generator \"scalelab\") — "
                                 "merge the files `scalelab train --trace` wrote");
    const json& other = t["otherData"];
    const auto integer_in = [](const json& v, double lo, double hi) {
      return v.is_number_integer() && v.get<double>() >= lo && v.get<double>() <= hi;
    };
    const json rank = other.value("rank", json(0));
    SCALELAB_CHECK_INPUT(integer_in(rank, 0, 1 << 24),
                         where + ": otherData.rank is " + rank.dump() + ", not a rank — merge the per-rank files, not a merged one");
    const json o = other.value("origin_unix_us", json(0));
    SCALELAB_CHECK_INPUT(integer_in(o, -static_cast<double>(kMaxOrigin), static_cast<double>(kMaxOrigin)),
                         where + ": otherData.origin_unix_us is " + o.dump() + ", not microseconds on the wall clock");
    for (const auto& e : t["traceEvents"]) {
      SCALELAB_CHECK_INPUT(e.is_object() && (!e.contains("ts") || e["ts"].is_number()),
                           where + ": an event is not an object with a numeric ts: " + e.dump().substr(0, 200));
    }
    SCALELAB_CHECK_INPUT(ranks.insert(rank.get<int>()).second,
                         where + " is rank " + rank.dump() +
                             " like an earlier input — pass each rank's file once (run.trace.rank0.json, run.trace.rank1.json, ...)");
    origin = first ? o.get<std::int64_t>() : std::min(origin, o.get<std::int64_t>());
    first = false;
  }
  json events = json::array();
  json inputs = json::array();
  for (const auto& t : traces) {
    const json& other = t["otherData"];
    const double shift = static_cast<double>(other.value("origin_unix_us", std::int64_t{0}) - origin);
    for (const auto& e : t["traceEvents"]) {
      json c = e;
      if (c.contains("ts") && c.value("ph", json()) != "M") c["ts"] = c["ts"].get<double>() + shift;
      events.push_back(std::move(c));
    }
    json in = other;
    in["shift_us"] = shift;
    inputs.push_back(std::move(in));
  }
  json other = traces.front()["otherData"];
  other["rank"] = nullptr;
  other["merged"] = true;
  other["ranks"] = ranks.size();
  other["origin_unix_us"] = origin;
  other["inputs"] = std::move(inputs);
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

}  // namespace scalelab
