#pragma once
// The results database: one SQLite file (default results/scalelab.db) in WAL mode.
//
// Tables (schema version kSchemaVersion, recorded in `schema_version`):
//   sweeps(sweep_id, name UNIQUE, kind 'sweep'|'oom-search'|'ladder', spec JSON, result JSON,
//          created_at, updated_at)
//   trials(trial_id, sweep_id, config_hash, config JSON, repeat, role, status
//          'ok'|'oom'|'error'|'timeout', reason, exit_code, signal, metrics JSON, record JSON,
//          command, log_path, host, started_at, ended_at, duration_s, scalelab_version, git_rev,
//          telemetry_summary JSON, current)
//   telemetry_samples(trial_id, t_s, source, device, metric, value)   -- long format
//
// A trial row is written once, when the trial has ended, in one transaction (with its telemetry
// samples when given), so a runner killed at any moment leaves either the whole row or none.
// Re-running a trial (--retry-failed, --rerun) inserts a new row and marks the older rows of the
// same (sweep, config_hash, repeat) current = 0 in the same transaction; views show current rows.
//
// A database whose schema_version is newer than this build's is refused (InvalidInput).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lab/params.h"
#include "lab/trial_status.h"

struct sqlite3;

namespace scalelab::lab {

inline constexpr int kSchemaVersion = 1;

struct SweepRow {
  std::int64_t sweep_id = 0;
  std::string name;
  std::string kind;  // "sweep", "oom-search", "ladder"
  Json spec;         // what was asked (workload, parameters, options)
  Json result;       // what the sweep concluded (the OOM limit, the ladder's rungs); null if none
  std::string created_at, updated_at;
};

// One finished trial, as inserted.
struct TrialRecord {
  std::string config_hash;
  Json config;  // {"workload": ..., "params": {...}}
  int repeat = 0;
  std::string role;  // what the trial was for ("ladder: flash attention", "oom-search"); may be ""
  TrialStatus status = TrialStatus::kError;
  std::string reason;
  std::optional<int> exit_code;
  std::optional<int> signal;
  Json metrics = Json::object();
  Json record;  // native run record or null
  std::string command;
  std::string log_path;
  std::string host;
  std::string started_at, ended_at;  // ISO 8601 UTC
  double duration_s = 0;
  std::string scalelab_version, git_rev;
  Json telemetry_summary;  // filled by telemetry; null when none
};

struct TrialRow : TrialRecord {
  std::int64_t trial_id = 0;
  std::int64_t sweep_id = 0;
  std::string sweep_name;
  bool current = true;
  // The parameters of config["params"].
  ParamMap params() const;
};

struct TelemetrySample {
  std::int64_t trial_id = 0;
  double t_s = 0;        // seconds since the trial started
  std::string source;    // "nvml", "nvidia-smi", "process", "engine", ...
  std::string device;    // "0", "GPU-<uuid>", "host", ...
  std::string metric;    // "power_w", "memory_used_bytes", ...
  double value = 0;
};

class ResultsStore {
 public:
  enum class Mode { kReadWrite, kReadOnly };

  // Opens (read-write: creating the file, its directory and the schema when missing) the
  // database at `path`. InvalidInput when the path is not writable / not a database / from a
  // newer schema; read-only mode also when the file does not exist.
  ResultsStore(const std::string& path, Mode mode);
  ~ResultsStore();
  ResultsStore(const ResultsStore&) = delete;
  ResultsStore& operator=(const ResultsStore&) = delete;

  const std::string& path() const { return path_; }
  int schema_version() const { return schema_version_; }

  // Returns the sweep `name`, creating it with `kind` and `spec` when missing (and replacing
  // the spec when it exists). InvalidInput when it exists with another kind.
  std::int64_t ensure_sweep(const std::string& name, const std::string& kind, const Json& spec);
  void set_sweep_result(std::int64_t sweep_id, const Json& result);
  std::optional<SweepRow> find_sweep(const std::string& name) const;
  std::vector<SweepRow> sweeps() const;

  // Inserts a finished trial atomically (row + samples, superseding older rows of the same key).
  std::int64_t insert_trial(std::int64_t sweep_id, const TrialRecord& trial,
                            const std::vector<TelemetrySample>& samples = {});
  // The current row of (sweep, config_hash, repeat), if any.
  std::optional<TrialRow> find_trial(std::int64_t sweep_id, const std::string& config_hash, int repeat) const;
  std::optional<TrialRow> trial(std::int64_t trial_id) const;
  // Trials of one sweep (sweep_id > 0) or all; current rows only unless include_superseded.
  std::vector<TrialRow> trials(std::int64_t sweep_id = 0, bool include_superseded = false) const;

  // Telemetry (filled by the telemetry component).
  void set_telemetry_summary(std::int64_t trial_id, const Json& summary);
  void insert_telemetry_samples(std::int64_t trial_id, const std::vector<TelemetrySample>& samples);
  // Samples of one trial (trial_id > 0), or of every trial of a sweep (sweep_id > 0), or all.
  std::vector<TelemetrySample> telemetry_samples(std::int64_t trial_id = 0, std::int64_t sweep_id = 0) const;

 private:
  void create_or_check_schema();
  void exec(const char* sql) const;

  std::string path_;
  Mode mode_;
  sqlite3* db_ = nullptr;
  int schema_version_ = 0;
};

// Where a database path's lock file and default log directory are.
std::string lock_path_for(const std::string& db_path);
std::string default_log_dir_for(const std::string& db_path);

// Current time as ISO 8601 UTC with milliseconds ("2024-05-01T12:00:00.123Z").
std::string utc_now_iso();
std::string host_name();

}  // namespace scalelab::lab
