#pragma once
// The timeline of a run (`scalelab train --trace FILE`): events recorded in memory while the run
// goes and written at its end as Chrome trace-event JSON (the "JSON Object Format" that Perfetto
// and chrome://tracing open):
//
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
//
// Events ("ph" codes of the format):
//   X  complete events: op families (cat "op", from ProfileScope, args.phase), regions (cat
//      "layer" / "phase" / "step", from RegionScope and the trainer), communication (cat "comm")
//   C  counters: device memory (allocated / reserved bytes, at every allocator event), tokens
//   M  metadata: process_name ("rank R · device"), thread_name, process_sort_index
// pid is the rank (0 in a single process); tid 0 is the thread that made the tracer ("main"),
// tid 1 the communication track (collectives as the communication engine ran them, not a real
// thread), other threads 2, 3, ... in the order they first record. Timestamps are microseconds
// since the tracer was made (steady clock); otherData.origin_unix_us holds that origin on the
// wall clock, which is how merge_traces() aligns the files of several ranks.
//
// Recording takes a mutex and appends one small struct; nothing is formatted until the end.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace scalelab {

struct TraceMeta {
  int rank = 0;
  int world_size = 1;
  std::string device;       // "cpu", "cuda"
  std::string description;  // the device's one-line description
  nlohmann::json extra = nlohmann::json::object();  // copied into otherData (model, config, ...)
};

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMainTid = 0;
  static constexpr int kCommTid = 1;
  // Beyond this many events the tracer stops recording and says so in otherData.dropped_events.
  static constexpr std::size_t kDefaultMaxEvents = 4'000'000;

  explicit Tracer(TraceMeta meta, std::size_t max_events = kDefaultMaxEvents);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Microseconds since the origin.
  double us(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }
  double now_us() const { return us(Clock::now()); }
  const TraceMeta& meta() const { return meta_; }

  // The calling thread's tid (0 for the thread that made the tracer).
  int this_tid();

  // A complete event [start, end] on `tid` (-1: the calling thread). `cat` must be a literal.
  // phase: args.phase or null; index: args.index when >= 0 (layer, bucket); bytes: args.bytes
  // when >= 0.
  void complete(std::string name, const char* cat, Clock::time_point start, Clock::time_point end,
                const char* phase = nullptr, std::int64_t index = -1, std::int64_t bytes = -1, int tid = -1);
  // The same with times in microseconds on this tracer's time base (events measured by another
  // clock: the device's, CUPTI's), on a track from track().
  void complete_us(std::string name, const char* cat, double ts_us, double dur_us, int tid, const char* phase = nullptr,
                   std::int64_t index = -1, std::int64_t bytes = -1);
  // The tid of a named track that is not a host thread ("GPU: op families (CUDA events)", "CUDA
  // stream 7 (CUPTI)"): the same name gives the same tid; tids from kFirstTrackTid up, named in the
  // metadata.
  static constexpr int kFirstTrackTid = 1000;
  int track(const std::string& name);
  // A counter sample: series `key1` (and `key2` when not null) of counter `name` (literals).
  void counter(const char* name, Clock::time_point t, const char* key1, double v1, const char* key2 = nullptr,
               double v2 = 0);
  // An instant event on the calling thread.
  void instant(std::string name, const char* cat, Clock::time_point t);

  // Sets otherData[key] (after the metadata given at construction): measured_from_us, status, ...
  void set_other(const std::string& key, nlohmann::json value);

  std::size_t size() const;
  std::size_t dropped() const { return dropped_.load(); }
  // The whole trace as JSON (metadata first, then events in recording order).
  nlohmann::json to_json() const;
  // Writes to_json() to `path` (atomically: temporary file + rename); throws RuntimeError.
  void write(const std::string& path) const;

 private:
  struct Event {
    std::string name;
    const char* cat = nullptr;
    const char* phase = nullptr;
    const char* key1 = nullptr;
    const char* key2 = nullptr;
    double ts = 0, dur = 0, v1 = 0, v2 = 0;
    std::int64_t index = -1, bytes = -1;
    int tid = 0;
    char ph = 'X';
  };
  void push(Event&& e);

  TraceMeta meta_;
  std::size_t max_events_;
  Clock::time_point origin_;
  std::int64_t origin_unix_us_ = 0;
  std::uint64_t serial_;  // tells this tracer's thread ids apart from an earlier tracer's
  mutable std::mutex mu_;
  std::vector<Event> events_;
  nlohmann::json other_ = nlohmann::json::object();
  std::atomic<std::size_t> dropped_{0};
  std::atomic<int> next_tid_{2};
  std::vector<std::string> tracks_;  // tid kFirstTrackTid + i (under mu_)
};

// The trace file of a rank: FILE itself with one rank; with several, "run.trace.json" becomes
// "run.trace.rank1.json" (the rank before the last extension, or appended when there is none).
std::string trace_path_for_rank(const std::string& path, int rank, int world_size);

// Merges the traces of several ranks (each as written by Tracer::write) into one: every event
// keeps its pid (the rank), timestamps are shifted so that all files share the earliest origin on
// the wall clock, otherData lists each input's. Throws InvalidInput for an input that is not a
// scalelab trace (or whose rank, origin or event timestamps are not numbers of the right kind)
// and for two inputs of the same rank, naming the input by `names` (the files) where given.
nlohmann::json merge_traces(const std::vector<nlohmann::json>& traces, const std::vector<std::string>& names = {});

}  // namespace scalelab
