// The trial executor: recording, resumption rules, and the per-trial monitor seam (telemetry).
#include "lab/executor.h"
#include "lab/interrupted.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <cstdio>

#include "core/error.h"
#include "lab_test_util.h"
#include "scalelab/version.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  testing::TempDir dir;
  ResultsStore store{dir / "r.db", ResultsStore::Mode::kReadWrite};
  std::int64_t sweep = store.ensure_sweep("s", "sweep", {});
  LabOptions options() {
    LabOptions o;
    o.db_path = dir / "r.db";
    o.timeout_s = 30;
    return o;
  }
};

// Prints the throughput given as {tps}; a negative value fails like a crash.
Workload echo_workload() {
  return Workload::external(
      "if [ {tps} -lt 0 ]; then echo boom; exit 1; fi; echo \"Training throughput: {tps} tokens/s\"", "test");
}

TEST(Executor, RecordsAndReusesTrials) {
  Fixture f;
  TrialExecutor exec(f.store, f.sweep, "s", echo_workload(), f.options(), Progress::silent());
  auto first = exec.run({{"tps", 5}}, 0, "role-a");
  EXPECT_FALSE(first.cached);
  EXPECT_EQ(first.row.status, TrialStatus::kOk);
  EXPECT_EQ(first.row.role, "role-a");
  EXPECT_DOUBLE_EQ(first.row.metrics["tokens_per_s_per_device"].get<double>(), 5);
  EXPECT_THAT(first.row.command, HasSubstr("Training throughput: 5 tokens/s"));
  EXPECT_EQ(first.row.log_path, exec.log_dir() + "/" + first.row.config_hash.substr(0, 12) + "-r0.log");
  auto again = exec.run({{"tps", 5}}, 0, "role-b");
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(again.row.trial_id, first.row.trial_id);
  EXPECT_FALSE(exec.run({{"tps", 5}}, 1, "role-a").cached);  // another repeat is another trial

  auto failed = exec.run({{"tps", -1}}, 0, "");
  EXPECT_EQ(failed.row.status, TrialStatus::kError);
  EXPECT_EQ(failed.row.reason, "exit code 1: boom");
  EXPECT_EQ(failed.row.exit_code, 1);

  // A new runner with --retry-failed runs the failed trial again (once), not the good one.
  LabOptions retry = f.options();
  retry.retry_failed = true;
  TrialExecutor exec2(f.store, f.sweep, "s", echo_workload(), retry, Progress::silent());
  EXPECT_TRUE(exec2.run({{"tps", 5}}, 0, "").cached);
  auto rerun = exec2.run({{"tps", -1}}, 0, "");
  EXPECT_FALSE(rerun.cached);
  EXPECT_NE(rerun.row.log_path, failed.row.log_path);  // the first attempt's log is kept
  EXPECT_TRUE(exec2.run({{"tps", -1}}, 0, "").cached);  // not again within the same run
  EXPECT_EQ(f.store.trials(f.sweep).size(), 3u);
  EXPECT_EQ(f.store.trials(f.sweep, true).size(), 4u);

  // --rerun runs everything again, once per runner.
  LabOptions all = f.options();
  all.rerun = true;
  TrialExecutor exec3(f.store, f.sweep, "s", echo_workload(), all, Progress::silent());
  EXPECT_FALSE(exec3.run({{"tps", 5}}, 0, "").cached);
  EXPECT_TRUE(exec3.run({{"tps", 5}}, 0, "").cached);
}

// A trial recorded by another build is reused (resuming a sweep after a rebuild must not re-run
// it), but the runner says whose figures they are, once per other build.
TEST(Executor, SaysWhenItReusesTrialsOfAnotherBuild) {
  Fixture f;
  {
    TrialExecutor exec(f.store, f.sweep, "s", echo_workload(), f.options(), Progress::silent());
    ASSERT_FALSE(exec.run({{"tps", 5}}, 0, "").cached);
    ASSERT_FALSE(exec.run({{"tps", 6}}, 0, "").cached);
  }
  auto notes = [&](std::FILE* out) {
    std::fflush(out);
    std::rewind(out);
    std::string text;
    char buf[512];
    while (std::fgets(buf, sizeof buf, out)) text += buf;
    return text;
  };
  std::FILE* same = std::tmpfile();
  ASSERT_NE(same, nullptr);
  {
    Progress progress(same, false);
    TrialExecutor exec(f.store, f.sweep, "s", echo_workload(), f.options(), progress);
    EXPECT_TRUE(exec.run({{"tps", 5}}, 0, "").cached);
  }
  EXPECT_EQ(notes(same).find("reusing trials recorded by"), std::string::npos) << notes(same);
  std::fclose(same);
  // The same trials as if an older build had recorded them.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((f.dir / "r.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE trials SET git_rev = 'abc1234'", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  std::FILE* other = std::tmpfile();
  ASSERT_NE(other, nullptr);
  {
    Progress progress(other, false);
    TrialExecutor exec(f.store, f.sweep, "s", echo_workload(), f.options(), progress);
    EXPECT_TRUE(exec.run({{"tps", 5}}, 0, "").cached);
    EXPECT_TRUE(exec.run({{"tps", 6}}, 0, "").cached);
  }
  const std::string text = notes(other);
  std::fclose(other);
  if (std::string(SCALELAB_GIT_REV) == "unknown") GTEST_SKIP() << "this build has no git revision to compare";
  EXPECT_THAT(text, HasSubstr("reusing trials recorded by scalelab abc1234 (this build is " +
                              std::string(SCALELAB_GIT_REV) + ")"));
  EXPECT_THAT(text, HasSubstr("--rerun"));
  // Once per other build, not per trial.
  EXPECT_EQ(text.find("reusing trials"), text.rfind("reusing trials")) << text;
}

TEST(Executor, ReusedTrialsNoteNamesAnotherOrAnUncommittedBuild) {
  EXPECT_EQ(reused_trial_note("abc1234", "abc1234"), "");
  EXPECT_EQ(reused_trial_note("", "abc1234"), "");
  EXPECT_EQ(reused_trial_note("abc1234", "unknown"), "");
  EXPECT_THAT(reused_trial_note("abc1234", "def5678"),
              HasSubstr("reusing trials recorded by scalelab abc1234 (this build is def5678)"));
  EXPECT_THAT(reused_trial_note("abc1234", "abc1234-dirty"),
              HasSubstr("recorded by scalelab abc1234 (this build is abc1234-dirty)"));
  // The same uncommitted revision: the changes themselves are not recorded, so it may be another build.
  const std::string same_dirty = reused_trial_note("abc1234-dirty", "abc1234-dirty");
  EXPECT_THAT(same_dirty, HasSubstr("uncommitted changes (abc1234-dirty)"));
  EXPECT_THAT(same_dirty, HasSubstr("--rerun"));
}

class RecordingMonitor : public TrialMonitor {
 public:
  explicit RecordingMonitor(int* started_pid) : started_pid_(started_pid) {}
  void start(int pid) override { *started_pid_ = pid; }
  void stop(std::vector<TelemetrySample>& samples, Json& summary) override {
    samples.push_back({0, 0.0, "process", "host", "rss_bytes", 1000});
    samples.push_back({0, 0.1, "process", "host", "rss_bytes", 2000});
    summary = {{"rss_bytes", {{"max", 2000}}}};
  }

 private:
  int* started_pid_;
};

TEST(Executor, MonitorSamplesAreStoredWithTheTrial) {
  Fixture f;
  int pid = 0;
  LabOptions o = f.options();
  o.monitor = [&] { return std::make_unique<RecordingMonitor>(&pid); };
  TrialExecutor exec(f.store, f.sweep, "s", echo_workload(), o, Progress::silent());
  auto r = exec.run({{"tps", 7}}, 0, "");
  EXPECT_GT(pid, 0);
  EXPECT_EQ(r.row.telemetry_summary["rss_bytes"]["max"], 2000);
  auto samples = f.store.telemetry_samples(r.row.trial_id);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[1].trial_id, r.row.trial_id);
  EXPECT_DOUBLE_EQ(samples[1].value, 2000);
}

TEST(Executor, NativeNeedsAnExistingEngine) {
  Fixture f;
  LabOptions o = f.options();
  o.engine = f.dir / "missing-engine";
  EXPECT_THROW(TrialExecutor(f.store, f.sweep, "s", Workload::native(), o, Progress::silent()), InvalidInput);
}

TEST(Executor, CancelledTrialIsNotRecorded) {
  Fixture f;
  std::atomic<bool> cancel{true};
  LabOptions o = f.options();
  o.cancel = &cancel;
  TrialExecutor exec(f.store, f.sweep, "s", echo_workload(), o, Progress::silent());
  EXPECT_THROW(exec.run({{"tps", 5}}, 0, ""), Interrupted);
  EXPECT_TRUE(f.store.trials(f.sweep).empty());
}

}  // namespace
}  // namespace scalelab::lab
