// Fault injection in the lab (docs/reliability.md): the runner killed with SIGKILL at random
// points of a sweep over many seeds, trials that are killed, hang, or flood their log, and the
// disk filling up (a file-size limit on the runner) while results are written. Each asserts what
// the lab promises: nothing recorded is lost, nothing is recorded twice, the database passes
// PRAGMA integrity_check, and the message says what happened.
// (Elsewhere: a second runner refused or waiting, tests/lab/cli_test.cpp TwoRunnersOnOneDatabase; a
// runner killed while a trial hangs, KilledRunnerLosesAtMostTheRunningTrial; a rank killed under
// mpirun, tests/distributed/mpi_launch_test.cpp MpiJob.RankThatIsKilledEndsTheJob.)
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/resource.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>

#include "core/error.h"
#include "lab/store.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;
using namespace testing;

std::string integrity(const std::string& db_path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return "cannot open";
  }
  sqlite3_stmt* st = nullptr;
  std::string out = "?";
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// Every row of the database (superseded ones too), by trial id: what must never change once written.
using Snapshot = std::map<std::int64_t, std::tuple<std::string, int, std::string, std::string, std::string>>;
Snapshot snapshot(const std::string& db_path) {
  Snapshot s;
  if (!fs::exists(db_path)) return s;
  try {
    ResultsStore probe(db_path, ResultsStore::Mode::kReadOnly);
  } catch (const InvalidInput& e) {
    // Killed while creating the file: no schema yet, nothing recorded (the next runner creates it).
    if (std::string(e.what()).find("holds no results yet") != std::string::npos) return s;
    throw;
  }
  ResultsStore store(db_path, ResultsStore::Mode::kReadOnly);
  for (const TrialRow& t : store.trials(0, true)) {
    s[t.trial_id] = {t.config_hash, t.repeat, std::string(status_name(t.status)), t.metrics.dump(), t.log_path};
  }
  return s;
}

int count_calls(const std::string& calls_file) {
  std::ifstream f(calls_file);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) n += line.rfind("train", 0) == 0;
  return n;
}

// Starts `scalelab <args>` like start_scalelab, with RLIMIT_FSIZE = `fsize` bytes (the runner and
// its trials cannot write a file past it: a full disk without root mounts) and SIGXFSZ either at
// its default (the process is killed) or ignored (writes fail with EFBIG).
pid_t start_with_file_limit(const std::vector<std::string>& args, const std::string& cwd,
                            const std::vector<std::string>& env, const std::string& out_file,
                            const std::string& err_file, rlim_t fsize, bool ignore_sigxfsz) {
  std::string cmd = "cd " + shell_quote(cwd) + " && exec env";
  for (const auto& e : env) add_word(cmd, e);
  add_word(cmd, SCALELAB_EXE);
  for (const auto& a : args) add_word(cmd, a);
  cmd += " </dev/null";
  // The output files are opened before the limit, and written at offsets far below it.
  const int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out, 1);
    ::dup2(err, 2);
    struct rlimit rl {fsize, fsize};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    ::signal(SIGXFSZ, ignore_sigxfsz ? SIG_IGN : SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(out);
  ::close(err);
  return pid;
}

struct Lab {
  TempDir dir;
  std::string engine = fake_engine(dir);
  std::string db = dir / "results/r.db";
  std::string calls = dir / "calls.txt";
  std::vector<std::string> env(std::vector<std::string> extra = {}) const {
    extra.push_back("FAKE_ENGINE_CALLS=" + calls);
    return extra;
  }
  std::string spec(const std::string& name, const std::string& text) const {
    std::string p = dir / name;
    write_text(p, text);
    return p;
  }
};

// Eight quick trials (two repeats of four configurations).
const char* const kQuick = R"(
name = "quick"
repeats = 2
[parameters]
model = "llama-tiny"
micro_batch_size = [1, 2, 3, 4]
)";

TEST(Faults, RunnerKilledAtRandomPointsLosesAndDuplicatesNothing) {
  // Each seed kills the runner (SIGKILL) up to three times at random moments, resuming after each
  // kill, then lets it finish. Checked after every kill and at the end: every row written before
  // is still there unchanged, the database is intact, and at the end each (configuration, repeat)
  // has exactly one current row.
  constexpr int kSeeds = 12;
  int kills = 0, kills_mid_sweep = 0;
  for (int seed = 0; seed < kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Lab lab;
    const std::string spec = lab.spec("quick.toml", kQuick);
    const std::vector<std::string> args = {"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--no-telemetry"};
    std::mt19937 rng(static_cast<unsigned>(seed));
    // A trial of the fake engine takes tens of milliseconds; the runner's start about as long.
    std::uniform_int_distribution<int> delay_ms(0, 600);
    std::uniform_int_distribution<int> n_kills(1, 3);
    Snapshot before;
    const int rounds = n_kills(rng);
    for (int round = 0; round < rounds; ++round) {
      const pid_t pid = start_scalelab(args, lab.dir.path(), lab.env({"FAKE_ENGINE_SLEEP=0.05"}),
                                       lab.dir / "a.out", lab.dir / "a.err");
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      const bool was_running = pid_alive(pid);
      ::kill(pid, SIGKILL);
      wait_exit(pid);
      if (was_running) ++kills;
      ASSERT_THAT(integrity(lab.db), ::testing::AnyOf("ok", "cannot open")) << "round " << round;
      if (!fs::exists(lab.db)) continue;
      const Snapshot now = snapshot(lab.db);
      for (const auto& [id, row] : before) {
        ASSERT_TRUE(now.count(id)) << "trial " << id << " was lost";
        EXPECT_EQ(now.at(id), row) << "trial " << id << " changed";
      }
      if (was_running && !now.empty() && now.size() < 8) ++kills_mid_sweep;
      before = now;
    }
    CliResult r = run_scalelab(args, lab.dir.path(), lab.env());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(integrity(lab.db), "ok");
    const Snapshot after = snapshot(lab.db);
    for (const auto& [id, row] : before) {
      ASSERT_TRUE(after.count(id)) << "trial " << id << " was lost";
      EXPECT_EQ(after.at(id), row);
    }
    ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
    std::set<std::pair<std::string, int>> current;
    for (const TrialRow& t : store.trials(0, false)) {
      EXPECT_TRUE(current.insert({t.config_hash, t.repeat}).second) << "duplicate row for " << t.config_hash;
      EXPECT_EQ(t.status, TrialStatus::kOk);
    }
    EXPECT_EQ(current.size(), 8u);
    // A trial is run again only when a kill interrupted it: at most one extra run per kill.
    EXPECT_GE(count_calls(lab.calls), 8);
    EXPECT_LE(count_calls(lab.calls), 8 + rounds);
  }
  // The figures docs/reliability.md quotes (ctest -R Faults --output-on-failure -V shows them).
  if (!HasFailure()) {
    std::printf("[faults] %d seeds, %d runner kills (%d in the middle of the sweep), 0 rows lost or duplicated\n",
                kSeeds, kills, kills_mid_sweep);
  }
  EXPECT_GT(kills, 0);
}

TEST(Faults, TrialsThatAreKilledHangOrFloodTheirLogAreRecordedAndTheSweepGoesOn) {
  Lab lab;
  // A trial killed by SIGKILL, one that ignores SIGTERM and hangs, one that writes its log as fast
  // as it can (stopped at --max-log-size), and a healthy one after them.
  const std::string spec = lab.spec("faulty.toml", R"(
name = "faulty"
timeout = 4
[workload]
type = "external"
command = "echo start; {case}"
required_metrics = []
[workload.map.case]
killed = "kill -9 $$"
hung = "trap '' TERM; while :; do sleep 1; done"
flood = "yes flooding-the-log"
fine = "echo fine"
[parameters]
case = ["killed", "hung", "flood", "fine"]
)");
  CliResult r = run_scalelab({"sweep", spec, "--db", lab.db, "--kill-grace", "0.3", "--max-log-size", "2MiB",
                              "--no-telemetry", "--format", "json"},
                             lab.dir.path(), lab.env());
  ASSERT_EQ(r.code, 0) << r.err;
  const Json rows = Json::parse(r.out);
  ASSERT_EQ(rows.size(), 4u);
  std::map<std::string, Json> by;
  for (const auto& row : rows) by[row["case"].get<std::string>()] = row;
  EXPECT_EQ(by["killed"]["status"], "error");
  EXPECT_THAT(by["killed"]["reason"].get<std::string>(), HasSubstr("killed by signal 9"));
  EXPECT_EQ(by["hung"]["status"], "timeout");
  EXPECT_THAT(by["hung"]["reason"].get<std::string>(), HasSubstr("timed out after 4.0 s"));
  EXPECT_EQ(by["flood"]["status"], "error");
  EXPECT_THAT(by["flood"]["reason"].get<std::string>(), HasSubstr("its log passed 2.00 MiB"));
  EXPECT_EQ(by["fine"]["status"], "ok");
  // The flooding trial's log stopped near the limit (it is checked every 50 ms or less).
  ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
  for (const TrialRow& t : store.trials(0, false)) {
    if (t.params().at("case") != "flood") continue;
    EXPECT_GT(fs::file_size(t.log_path), 2u << 20);
    EXPECT_LT(fs::file_size(t.log_path), 512u << 20);
  }
  EXPECT_EQ(integrity(lab.db), "ok");
  EXPECT_FALSE(process_mentions({"while :; do sleep 1; done"}));
}

TEST(Faults, TwoRunnersStartedTogetherOnOneSweepRunEachTrialOnce) {
  // Both wait for the lock: one runs the sweep, the other then finds every trial recorded.
  Lab lab;
  const std::string spec = lab.spec("quick.toml", kQuick);
  const std::vector<std::string> args = {"sweep",  spec,           "--db",   lab.db, "--engine", lab.engine,
                                         "--wait", "--no-telemetry"};
  const pid_t a = start_scalelab(args, lab.dir.path(), lab.env(), lab.dir / "a.out", lab.dir / "a.err");
  const pid_t b = start_scalelab(args, lab.dir.path(), lab.env(), lab.dir / "b.out", lab.dir / "b.err");
  EXPECT_EQ(wait_exit(a), 0) << read_text(lab.dir / "a.err");
  EXPECT_EQ(wait_exit(b), 0) << read_text(lab.dir / "b.err");
  EXPECT_EQ(count_calls(lab.calls), 8);
  EXPECT_EQ(integrity(lab.db), "ok");
  EXPECT_EQ(snapshot(lab.db).size(), 8u);
  const std::string errs = read_text(lab.dir / "a.err") + read_text(lab.dir / "b.err");
  EXPECT_THAT(errs, HasSubstr("8 of 8 trials already in"));
}

// The disk fills up while the runner records results: the runner's files may not grow past a
// limit a little above what the first trials need.
class DiskFull : public ::testing::TestWithParam<bool> {};

TEST_P(DiskFull, RecordedTrialsSurviveAndTheMessageSaysSo) {
  const bool ignore_sigxfsz = GetParam();
  Lab lab;
  const std::string spec = lab.spec("quick.toml", kQuick);
  const std::vector<std::string> args = {"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--no-telemetry"};
  // Two trials first, with no limit: the database exists and holds them.
  const std::string two = lab.spec("two.toml", "name = \"quick\"\nrepeats = 2\n[parameters]\nmodel = \"llama-tiny\"\n"
                                               "micro_batch_size = 1\n");
  CliResult first = run_scalelab({"sweep", two, "--db", lab.db, "--engine", lab.engine, "--no-telemetry"},
                                 lab.dir.path(), lab.env());
  ASSERT_EQ(first.code, 0) << first.err;
  const Snapshot recorded = snapshot(lab.db);
  ASSERT_EQ(recorded.size(), 2u);
  // Then the full sweep with every file limited to the database's size plus 12 KiB: the WAL
  // fills after a few frames of 4 KiB.
  const rlim_t limit = static_cast<rlim_t>(fs::file_size(lab.db)) + (12u << 10);
  const pid_t pid = start_with_file_limit(args, lab.dir.path(), lab.env(), lab.dir / "f.out", lab.dir / "f.err",
                                          limit, ignore_sigxfsz);
  const int code = wait_exit(pid);
  const std::string err = read_text(lab.dir / "f.err");
  EXPECT_NE(code, 0) << err;
  if (ignore_sigxfsz) {
    // The write fails (EFBIG): the runner says which file and why, and exits 1.
    EXPECT_EQ(code, 1) << err;
    EXPECT_THAT(err, HasSubstr(lab.db));
    EXPECT_THAT(err, HasSubstr("the disk is full or a file-size limit was reached"));
  } else {
    EXPECT_EQ(code, 128 + SIGXFSZ) << err;  // the kernel's default for a process past its file-size limit
  }
  // Nothing recorded before is lost, the database is intact, and a run with room finishes the sweep.
  EXPECT_EQ(integrity(lab.db), "ok");
  const Snapshot after_fault = snapshot(lab.db);
  for (const auto& [id, row] : recorded) {
    ASSERT_TRUE(after_fault.count(id)) << "trial " << id << " was lost";
    EXPECT_EQ(after_fault.at(id), row);
  }
  CliResult r = run_scalelab(args, lab.dir.path(), lab.env());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(integrity(lab.db), "ok");
  ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
  std::set<std::pair<std::string, int>> current;
  for (const TrialRow& t : store.trials(0, false)) EXPECT_TRUE(current.insert({t.config_hash, t.repeat}).second);
  EXPECT_EQ(current.size(), 8u);
  for (const auto& [id, row] : after_fault) EXPECT_TRUE(snapshot(lab.db).count(id)) << "trial " << id << " was lost";
}

INSTANTIATE_TEST_SUITE_P(Faults, DiskFull, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("WritesFail") : std::string("ProcessKilled");
                         });

}  // namespace
}  // namespace scalelab::lab
