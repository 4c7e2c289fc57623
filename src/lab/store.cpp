#include "lab/store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"

namespace scalelab::lab {
namespace {

namespace fs = std::filesystem;

const char* const kSchemaSql = R"SQL(
CREATE TABLE schema_version (
  version    INTEGER NOT NULL,
  applied_at TEXT NOT NULL
);
CREATE TABLE sweeps (
  sweep_id   INTEGER PRIMARY KEY,
  name       TEXT NOT NULL UNIQUE,
  kind       TEXT NOT NULL,
  spec       TEXT NOT NULL,
  result     TEXT,
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL
);
CREATE TABLE trials (
  trial_id          INTEGER PRIMARY KEY,
  sweep_id          INTEGER NOT NULL REFERENCES sweeps(sweep_id),
  config_hash       TEXT NOT NULL,
  config            TEXT NOT NULL,
  repeat            INTEGER NOT NULL DEFAULT 0,
  role              TEXT NOT NULL DEFAULT '',
  status            TEXT NOT NULL CHECK (status IN ('ok', 'oom', 'error', 'timeout')),
  reason            TEXT NOT NULL DEFAULT '',
  exit_code         INTEGER,
  signal            INTEGER,
  metrics           TEXT NOT NULL DEFAULT '{}',
  record            TEXT,
  command           TEXT NOT NULL DEFAULT '',
  log_path          TEXT NOT NULL DEFAULT '',
  host              TEXT NOT NULL DEFAULT '',
  started_at        TEXT NOT NULL,
  ended_at          TEXT NOT NULL,
  duration_s        REAL NOT NULL DEFAULT 0,
  scalelab_version  TEXT NOT NULL DEFAULT '',
  git_rev           TEXT NOT NULL DEFAULT '',
  telemetry_summary TEXT,
  current           INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX trials_by_key ON trials(sweep_id, config_hash, repeat, current);
CREATE TABLE telemetry_samples (
  trial_id INTEGER NOT NULL REFERENCES trials(trial_id),
  t_s      REAL NOT NULL,
  source   TEXT NOT NULL,
  device   TEXT NOT NULL DEFAULT '',
  metric   TEXT NOT NULL,
  value    REAL
);
CREATE INDEX telemetry_by_trial ON telemetry_samples(trial_id, t_s);
)SQL";

const char* const kTrialColumns =
    "t.trial_id, t.sweep_id, s.name, t.config_hash, t.config, t.repeat, t.role, t.status, t.reason, "
    "t.exit_code, t.signal, t.metrics, t.record, t.command, t.log_path, t.host, t.started_at, "
    "t.ended_at, t.duration_s, t.scalelab_version, t.git_rev, t.telemetry_summary, t.current";

// The message of a failed statement: SQLite's, the database file, the system error behind it, and
// for a full disk (ENOSPC, a quota, a file-size limit) what to do. Rows committed before stay.
std::string sql_failure(sqlite3* db, int rc, const std::string& what) {
  std::string msg = "[results] " + what + " failed (" + sqlite3_errmsg(db) + ")";
  const char* file = sqlite3_db_filename(db, "main");
  if (file != nullptr && *file != '\0') msg += " on " + std::string(file);
  // SQLite keeps the system error of some failures only (not of a failed WAL write at COMMIT).
  const int sys = sqlite3_system_errno(db);
  if (sys != 0) msg += ": " + std::string(std::strerror(sys));
  const int extended = sqlite3_extended_errcode(db);
  if ((rc & 0xff) == SQLITE_FULL || extended == SQLITE_FULL || extended == SQLITE_IOERR_WRITE ||
      extended == SQLITE_IOERR_FSYNC || extended == SQLITE_IOERR_TRUNCATE || sys == ENOSPC || sys == EFBIG ||
      sys == EDQUOT) {
    msg += " — the disk is full or a file-size limit was reached; free space and run the same command again "
           "(trials recorded before are kept)";
  }
  return msg;
}

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      throw RuntimeError(std::string("[results] SQL prepare failed (") + sqlite3_errmsg(db) + ") for: " + sql);
    }
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& bind(int i, int v) { return bind(i, static_cast<std::int64_t>(v)); }
  Stmt& bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Stmt& bind_null(int i) {
    sqlite3_bind_null(stmt_, i);
    return *this;
  }
  Stmt& bind_json(int i, const Json& j) {
    if (j.is_null()) return bind_null(i);
    return bind(i, j.dump());
  }
  Stmt& bind_opt(int i, const std::optional<int>& v) { return v ? bind(i, *v) : bind_null(i); }

  // true while there is a row.
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw RuntimeError(sql_failure(db_, rc, "SQL"));
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::int64_t i64(int col) const { return sqlite3_column_int64(stmt_, col); }
  double f64(int col) const { return sqlite3_column_double(stmt_, col); }
  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string text(int col) const {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  Json json(int col) const {
    if (is_null(col)) return Json();
    try {
      return Json::parse(text(col));
    } catch (const Json::exception&) {
      return Json(text(col));
    }
  }
  std::optional<int> opt_int(int col) const {
    if (is_null(col)) return std::nullopt;
    return static_cast<int>(i64(col));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

TrialRow read_trial(const Stmt& s) {
  TrialRow r;
  r.trial_id = s.i64(0);
  r.sweep_id = s.i64(1);
  r.sweep_name = s.text(2);
  r.config_hash = s.text(3);
  r.config = s.json(4);
  r.repeat = static_cast<int>(s.i64(5));
  r.role = s.text(6);
  // The schema's CHECK admits only the four names.
  const std::string status = s.text(7);
  const std::optional<TrialStatus> parsed = parse_status(status);
  SCALELAB_CHECK(parsed.has_value(), "[results] trial " + std::to_string(r.trial_id) + " has the unknown status '" +
                                         status + "' — was the database written by another scalelab?");
  r.status = *parsed;
  r.reason = s.text(8);
  r.exit_code = s.opt_int(9);
  r.signal = s.opt_int(10);
  r.metrics = s.json(11);
  if (!r.metrics.is_object()) r.metrics = Json::object();
  r.record = s.json(12);
  r.command = s.text(13);
  r.log_path = s.text(14);
  r.host = s.text(15);
  r.started_at = s.text(16);
  r.ended_at = s.text(17);
  r.duration_s = s.f64(18);
  r.scalelab_version = s.text(19);
  r.git_rev = s.text(20);
  r.telemetry_summary = s.json(21);
  r.current = s.i64(22) != 0;
  return r;
}

SweepRow read_sweep(const Stmt& s) {
  SweepRow r;
  r.sweep_id = s.i64(0);
  r.name = s.text(1);
  r.kind = s.text(2);
  r.spec = s.json(3);
  r.result = s.json(4);
  r.created_at = s.text(5);
  r.updated_at = s.text(6);
  return r;
}

// Rolls back unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) { run("BEGIN IMMEDIATE"); }
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    run("COMMIT");
    done_ = true;
  }

 private:
  void run(const char* sql) {
    if (const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr); rc != SQLITE_OK) {
      throw RuntimeError(sql_failure(db_, rc, sql));
    }
  }
  sqlite3* db_;
  bool done_ = false;
};

}  // namespace

ParamMap TrialRow::params() const {
  ParamMap p;
  if (config.is_object() && config.contains("params") && config["params"].is_object()) {
    for (auto it = config["params"].begin(); it != config["params"].end(); ++it) p[it.key()] = it.value();
  }
  return p;
}

std::string utc_now_iso() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string lock_path_for(const std::string& db_path) { return db_path + ".lock"; }

std::string default_log_dir_for(const std::string& db_path) {
  fs::path p(db_path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  return (dir / "logs").string();
}

ResultsStore::ResultsStore(const std::string& path, Mode mode) : path_(path), mode_(mode) {
  const std::string hint = " — pass --db with a writable path";
  if (mode == Mode::kReadOnly) {
    if (!fs::exists(path)) {
      throw InvalidInput("[results] no results database at " + path +
                         " — run a sweep, oom-search or ladder first, or pass --db");
    }
  } else {
    fs::path p(path);
    if (p.has_parent_path()) {
      std::error_code ec;
      fs::create_directories(p.parent_path(), ec);
      if (ec) {
        throw InvalidInput("[results] cannot create the directory " + p.parent_path().string() + " for " + path +
                           " (" + ec.message() + ")" + hint);
      }
    }
  }
  int flags = mode == Mode::kReadOnly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw InvalidInput("[results] cannot open the results database " + path + " (" + msg + ")" + hint);
  }
  try {
    exec("PRAGMA busy_timeout = 10000");
    exec("PRAGMA foreign_keys = ON");
    create_or_check_schema();
  } catch (const InvalidInput&) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  } catch (const Error& e) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw InvalidInput("[results] cannot use " + path + " as a results database (" + e.what() + ")" + hint);
  }
}

ResultsStore::~ResultsStore() {
  if (db_) sqlite3_close(db_);
}

void ResultsStore::exec(const char* sql) const {
  if (const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr); rc != SQLITE_OK) {
    throw RuntimeError(sql_failure(db_, rc, sql));
  }
}

void ResultsStore::create_or_check_schema() {
  auto table_exists = [&](const char* name) {
    Stmt s(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?");
    s.bind(1, std::string(name));
    s.step();
    return s.i64(0) > 0;
  };
  auto read_version = [&] {
    Stmt s(db_, "SELECT max(version) FROM schema_version");
    s.step();
    return static_cast<int>(s.i64(0));
  };
  auto check_version = [&](int v) {
    if (v > kSchemaVersion) {
      throw InvalidInput("[results] " + path_ + " has schema version " + std::to_string(v) +
                         ", newer than this scalelab understands (" + std::to_string(kSchemaVersion) +
                         ") — use a newer scalelab, or pass --db with another database");
    }
    schema_version_ = v;
  };

  if (mode_ == Mode::kReadOnly) {
    if (!table_exists("schema_version")) {
      Stmt count(db_, "SELECT count(*) FROM sqlite_master");
      count.step();
      if (count.i64(0) == 0) {
        // A runner killed while it created the file (found by the fault-injection tests): the next
        // runner creates the schema; a reader has nothing to read yet.
        throw InvalidInput("[results] " + path_ + " holds no results yet (its runner was stopped before writing any)" +
                           " — run a sweep into it, or pass --db with another database");
      }
      throw InvalidInput("[results] " + path_ + " is not a scalelab results database (no schema_version table)" +
                         " — pass --db with a database written by scalelab");
    }
    check_version(read_version());
    return;
  }

  // WAL: readers (results, a dashboard) never block the runner, and a killed runner leaves a
  // consistent database. synchronous=NORMAL is crash-safe for the application in WAL mode.
  exec("PRAGMA journal_mode = WAL");
  exec("PRAGMA synchronous = NORMAL");
  Transaction tx(db_);
  if (table_exists("schema_version")) {
    check_version(read_version());
    tx.commit();
    return;
  }
  Stmt count(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table'");
  count.step();
  if (count.i64(0) > 0) {
    throw InvalidInput("[results] " + path_ +
                       " is an SQLite database but not a scalelab results database (it has other tables)"
                       " — pass --db with a new or scalelab-made file");
  }
  exec(kSchemaSql);
  Stmt ins(db_, "INSERT INTO schema_version(version, applied_at) VALUES (?, ?)");
  ins.bind(1, kSchemaVersion).bind(2, utc_now_iso());
  ins.step();
  tx.commit();
  schema_version_ = kSchemaVersion;
}

std::int64_t ResultsStore::ensure_sweep(const std::string& name, const std::string& kind, const Json& spec) {
  Transaction tx(db_);
  std::int64_t id = 0;
  {
    Stmt s(db_, "SELECT sweep_id, kind FROM sweeps WHERE name = ?");
    s.bind(1, name);
    if (s.step()) {
      id = s.i64(0);
      std::string existing = s.text(1);
      if (existing != kind) {
        throw InvalidInput("[results] '" + name + "' in " + path_ + " is a " + existing + ", not a " + kind +
                           " — choose another --name");
      }
    }
  }
  const std::string now = utc_now_iso();
  if (id != 0) {
    Stmt u(db_, "UPDATE sweeps SET spec = ?, updated_at = ? WHERE sweep_id = ?");
    u.bind(1, spec.dump()).bind(2, now).bind(3, id);
    u.step();
  } else {
    Stmt i(db_, "INSERT INTO sweeps(name, kind, spec, created_at, updated_at) VALUES (?, ?, ?, ?, ?)");
    i.bind(1, name).bind(2, kind).bind(3, spec.dump()).bind(4, now).bind(5, now);
    i.step();
    id = sqlite3_last_insert_rowid(db_);
  }
  tx.commit();
  return id;
}

void ResultsStore::set_sweep_result(std::int64_t sweep_id, const Json& result) {
  Stmt u(db_, "UPDATE sweeps SET result = ?, updated_at = ? WHERE sweep_id = ?");
  u.bind_json(1, result).bind(2, utc_now_iso()).bind(3, sweep_id);
  u.step();
}

std::optional<SweepRow> ResultsStore::find_sweep(const std::string& name) const {
  Stmt s(db_, "SELECT sweep_id, name, kind, spec, result, created_at, updated_at FROM sweeps WHERE name = ?");
  s.bind(1, name);
  if (!s.step()) return std::nullopt;
  return read_sweep(s);
}

std::vector<SweepRow> ResultsStore::sweeps() const {
  Stmt s(db_, "SELECT sweep_id, name, kind, spec, result, created_at, updated_at FROM sweeps ORDER BY sweep_id");
  std::vector<SweepRow> out;
  while (s.step()) out.push_back(read_sweep(s));
  return out;
}

std::int64_t ResultsStore::insert_trial(std::int64_t sweep_id, const TrialRecord& t,
                                        const std::vector<TelemetrySample>& samples) {
  Transaction tx(db_);
  {
    Stmt u(db_, "UPDATE trials SET current = 0 WHERE sweep_id = ? AND config_hash = ? AND repeat = ? AND current = 1");
    u.bind(1, sweep_id).bind(2, t.config_hash).bind(3, t.repeat);
    u.step();
  }
  Stmt i(db_,
         "INSERT INTO trials(sweep_id, config_hash, config, repeat, role, status, reason, exit_code, signal, "
         "metrics, record, command, log_path, host, started_at, ended_at, duration_s, scalelab_version, "
         "git_rev, telemetry_summary, current) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,1)");
  i.bind(1, sweep_id)
      .bind(2, t.config_hash)
      .bind(3, t.config.dump())
      .bind(4, t.repeat)
      .bind(5, t.role)
      .bind(6, std::string(status_name(t.status)))
      .bind(7, t.reason)
      .bind_opt(8, t.exit_code)
      .bind_opt(9, t.signal)
      .bind(10, (t.metrics.is_object() ? t.metrics : Json::object()).dump())
      .bind_json(11, t.record)
      .bind(12, t.command)
      .bind(13, t.log_path)
      .bind(14, t.host)
      .bind(15, t.started_at)
      .bind(16, t.ended_at)
      .bind(17, t.duration_s)
      .bind(18, t.scalelab_version)
      .bind(19, t.git_rev)
      .bind_json(20, t.telemetry_summary);
  i.step();
  std::int64_t id = sqlite3_last_insert_rowid(db_);
  if (!samples.empty()) {
    Stmt s(db_, "INSERT INTO telemetry_samples(trial_id, t_s, source, device, metric, value) VALUES (?,?,?,?,?,?)");
    for (const auto& smp : samples) {
      s.bind(1, id).bind(2, smp.t_s).bind(3, smp.source).bind(4, smp.device).bind(5, smp.metric).bind(6, smp.value);
      s.step();
      s.reset();
    }
  }
  {
    Stmt u(db_, "UPDATE sweeps SET updated_at = ? WHERE sweep_id = ?");
    u.bind(1, t.ended_at).bind(2, sweep_id);
    u.step();
  }
  tx.commit();
  return id;
}

std::optional<TrialRow> ResultsStore::find_trial(std::int64_t sweep_id, const std::string& config_hash,
                                                 int repeat) const {
  std::string sql = std::string("SELECT ") + kTrialColumns +
                    " FROM trials t JOIN sweeps s USING (sweep_id) WHERE t.sweep_id = ? AND t.config_hash = ? "
                    "AND t.repeat = ? AND t.current = 1 ORDER BY t.trial_id DESC LIMIT 1";
  Stmt s(db_, sql.c_str());
  s.bind(1, sweep_id).bind(2, config_hash).bind(3, repeat);
  if (!s.step()) return std::nullopt;
  return read_trial(s);
}

std::optional<TrialRow> ResultsStore::trial(std::int64_t trial_id) const {
  std::string sql = std::string("SELECT ") + kTrialColumns +
                    " FROM trials t JOIN sweeps s USING (sweep_id) WHERE t.trial_id = ?";
  Stmt s(db_, sql.c_str());
  s.bind(1, trial_id);
  if (!s.step()) return std::nullopt;
  return read_trial(s);
}

std::vector<TrialRow> ResultsStore::trials(std::int64_t sweep_id, bool include_superseded) const {
  std::string sql = std::string("SELECT ") + kTrialColumns + " FROM trials t JOIN sweeps s USING (sweep_id) WHERE 1";
  if (sweep_id > 0) sql += " AND t.sweep_id = ?";
  if (!include_superseded) sql += " AND t.current = 1";
  sql += " ORDER BY t.trial_id";
  Stmt s(db_, sql.c_str());
  if (sweep_id > 0) s.bind(1, sweep_id);
  std::vector<TrialRow> out;
  while (s.step()) out.push_back(read_trial(s));
  return out;
}

void ResultsStore::set_telemetry_summary(std::int64_t trial_id, const Json& summary) {
  Stmt u(db_, "UPDATE trials SET telemetry_summary = ? WHERE trial_id = ?");
  u.bind_json(1, summary).bind(2, trial_id);
  u.step();
  if (sqlite3_changes(db_) == 0) {
    throw InvalidInput("[results] no trial " + std::to_string(trial_id) + " in " + path_);
  }
}

void ResultsStore::insert_telemetry_samples(std::int64_t trial_id, const std::vector<TelemetrySample>& samples) {
  Transaction tx(db_);
  Stmt s(db_, "INSERT INTO telemetry_samples(trial_id, t_s, source, device, metric, value) VALUES (?,?,?,?,?,?)");
  for (const auto& smp : samples) {
    s.bind(1, trial_id).bind(2, smp.t_s).bind(3, smp.source).bind(4, smp.device).bind(5, smp.metric).bind(6, smp.value);
    s.step();
    s.reset();
  }
  tx.commit();
}

std::vector<TelemetrySample> ResultsStore::telemetry_samples(std::int64_t trial_id, std::int64_t sweep_id) const {
  std::string sql =
      "SELECT m.trial_id, m.t_s, m.source, m.device, m.metric, m.value FROM telemetry_samples m "
      "JOIN trials t USING (trial_id) WHERE 1";
  if (trial_id > 0) sql += " AND m.trial_id = ?";
  if (sweep_id > 0) sql += " AND t.sweep_id = ?";
  sql += " ORDER BY m.trial_id, m.t_s, m.source, m.device, m.metric";
  Stmt s(db_, sql.c_str());
  int i = 1;
  if (trial_id > 0) s.bind(i++, trial_id);
  if (sweep_id > 0) s.bind(i++, sweep_id);
  std::vector<TelemetrySample> out;
  while (s.step()) {
    TelemetrySample m;
    m.trial_id = s.i64(0);
    m.t_s = s.f64(1);
    m.source = s.text(2);
    m.device = s.text(3);
    m.metric = s.text(4);
    m.value = s.f64(5);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace scalelab::lab
