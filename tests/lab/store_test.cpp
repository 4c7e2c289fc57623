// The results database: schema and its version, bad paths, atomic trial rows that supersede
// re-runs, telemetry, and the one-runner lock.
#include "lab/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <thread>

#include "core/error.h"
#include "lab/runner_lock.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

TrialRecord record(const std::string& hash, int repeat, const std::string& status) {
  TrialRecord t;
  t.config_hash = hash;
  t.config = {{"params", {{"micro_batch_size", 4}}}, {"workload", {{"kind", "native"}}}};
  t.repeat = repeat;
  t.status = parse_status(status).value();
  t.metrics = {{"tokens_per_s_per_device", 100.0}};
  t.started_at = utc_now_iso();
  t.ended_at = utc_now_iso();
  t.exit_code = 0;
  return t;
}

void exec_sql(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

TEST(Store, CreatesSchemaInWalModeAndReopens) {
  TempDir dir;
  std::string path = dir / "sub/dir/results.db";
  {
    ResultsStore s(path, ResultsStore::Mode::kReadWrite);
    EXPECT_EQ(s.schema_version(), kSchemaVersion);
    std::int64_t id = s.ensure_sweep("a", "sweep", {{"x", 1}});
    EXPECT_EQ(s.ensure_sweep("a", "sweep", {{"x", 2}}), id);
    EXPECT_EQ(s.find_sweep("a")->spec["x"], 2);
    EXPECT_THROW(s.ensure_sweep("a", "ladder", {}), InvalidInput);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
  ResultsStore ro(path, ResultsStore::Mode::kReadOnly);
  EXPECT_EQ(ro.sweeps().size(), 1u);
}

TEST(Store, RefusesANewerSchema) {
  TempDir dir;
  std::string path = dir / "r.db";
  { ResultsStore s(path, ResultsStore::Mode::kReadWrite); }
  exec_sql(path, "INSERT INTO schema_version(version, applied_at) VALUES (99, 'future')");
  for (auto mode : {ResultsStore::Mode::kReadWrite, ResultsStore::Mode::kReadOnly}) {
    try {
      ResultsStore s(path, mode);
      FAIL() << "opened a newer schema";
    } catch (const InvalidInput& e) {
      EXPECT_THAT(e.what(), HasSubstr("schema version 99, newer than this scalelab understands (1)"));
    }
  }
}

TEST(Store, BadPathsAreInvalidInput) {
  TempDir dir;
  testing::write_text(dir / "file", "x");
  // A directory that cannot exist (its parent is a file): unwritable even for root.
  EXPECT_THROW(ResultsStore(dir / "file/sub/r.db", ResultsStore::Mode::kReadWrite), InvalidInput);
  // A file that is not a database.
  testing::write_text(dir / "text.db", std::string(4096, 'x'));
  EXPECT_THROW(ResultsStore(dir / "text.db", ResultsStore::Mode::kReadWrite), InvalidInput);
  // An SQLite database of something else.
  exec_sql(dir / "other.db", "CREATE TABLE t(x)");
  try {
    ResultsStore s(dir / "other.db", ResultsStore::Mode::kReadWrite);
    FAIL();
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a scalelab results database"));
  }
  EXPECT_THROW(ResultsStore(dir / "missing.db", ResultsStore::Mode::kReadOnly), InvalidInput);
  EXPECT_FALSE(std::filesystem::exists(dir / "missing.db"));
}

TEST(Store, TrialsAreFoundAndSuperseded) {
  TempDir dir;
  ResultsStore s(dir / "r.db", ResultsStore::Mode::kReadWrite);
  std::int64_t sw = s.ensure_sweep("sw", "sweep", {});
  std::int64_t t1 = s.insert_trial(sw, record("h1", 0, "error"));
  s.insert_trial(sw, record("h1", 1, "ok"));
  s.insert_trial(sw, record("h2", 0, "oom"));
  auto f = s.find_trial(sw, "h1", 0);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->trial_id, t1);
  EXPECT_EQ(f->status, TrialStatus::kError);
  EXPECT_EQ(f->params().at("micro_batch_size"), 4);
  EXPECT_EQ(f->sweep_name, "sw");
  EXPECT_EQ(f->exit_code, 0);
  EXPECT_FALSE(f->signal);

  std::int64_t t4 = s.insert_trial(sw, record("h1", 0, "ok"));  // a retry
  EXPECT_EQ(s.find_trial(sw, "h1", 0)->trial_id, t4);
  EXPECT_EQ(s.trials(sw).size(), 3u);
  EXPECT_EQ(s.trials(sw, true).size(), 4u);
  EXPECT_FALSE(s.trial(t1)->current);
  EXPECT_FALSE(s.find_trial(sw, "h3", 0));
  EXPECT_FALSE(s.find_trial(sw + 1, "h1", 0));
}

TEST(Store, Telemetry) {
  TempDir dir;
  ResultsStore s(dir / "r.db", ResultsStore::Mode::kReadWrite);
  std::int64_t sw = s.ensure_sweep("sw", "sweep", {});
  std::int64_t t = s.insert_trial(sw, record("h1", 0, "ok"), {{0, 0.0, "nvml", "0", "power_w", 300.0}});
  s.insert_telemetry_samples(t, {{0, 0.2, "nvml", "0", "power_w", 310.0}, {0, 0.2, "process", "host", "rss_bytes", 1e9}});
  s.set_telemetry_summary(t, {{"power_w", {{"avg", 305.0}}}});
  auto samples = s.telemetry_samples(t);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].trial_id, t);
  EXPECT_DOUBLE_EQ(samples[1].value, 310.0);
  EXPECT_EQ(s.telemetry_samples(0, sw).size(), 3u);
  EXPECT_EQ(s.trial(t)->telemetry_summary["power_w"]["avg"], 305.0);
  EXPECT_THROW(s.set_telemetry_summary(t + 100, {}), InvalidInput);
}

TEST(RunnerLock, SecondRunnerRefusesOrWaits) {
  TempDir dir;
  std::string db = dir / "r.db";
  auto first = std::make_unique<RunnerLock>(db, "sweep one", false);
  try {
    RunnerLock second(db, "sweep two", false);
    FAIL() << "two runners held the lock";
  } catch (const RuntimeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is in use by pid " + std::to_string(::getpid())));
    EXPECT_THAT(e.what(), HasSubstr("sweep one"));
    EXPECT_THAT(e.what(), HasSubstr("--wait"));
  }
  // Waiting, then giving up on Ctrl-C.
  std::atomic<bool> cancel{false};
  std::thread stop([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    cancel = true;
  });
  std::string notified;
  EXPECT_THROW(RunnerLock(db, "sweep two", true, &cancel, [&](const std::string& m) { notified = m; }), Interrupted);
  stop.join();
  EXPECT_THAT(notified, HasSubstr("waiting for"));
  // Waiting until the first runner ends.
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    first.reset();
  });
  RunnerLock third(db, "sweep three", true);
  release.join();
  EXPECT_THAT(testing::read_text(lock_path_for(db)), HasSubstr("sweep three"));
}

}  // namespace
}  // namespace scalelab::lab
