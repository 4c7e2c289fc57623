// End-to-end tests of `scalelab sweep / oom-search / ladder / results` with the fake engine
// (a stand-in for `scalelab train`/`plan`) and the fake external workload.
#include <sqlite3.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "lab/store.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace testing;

int train_calls(const std::string& calls_file) {
  std::ifstream f(calls_file);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) n += line.rfind("train", 0) == 0;
  return n;
}

std::string integrity(const std::string& db_path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return "cannot open";
  sqlite3_stmt* st = nullptr;
  std::string out = "?";
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

std::size_t trial_count(const std::string& db_path) {
  try {
    ResultsStore s(db_path, ResultsStore::Mode::kReadOnly);
    return s.trials().size();
  } catch (const std::exception&) {
    return 0;
  }
}

struct Lab {
  TempDir dir;
  std::string engine = fake_engine(dir);
  std::string db = dir / "results/r.db";
  std::string calls = dir / "calls.txt";
  std::vector<std::string> env() const { return {"FAKE_ENGINE_CALLS=" + calls}; }
  std::string spec(const std::string& name, const std::string& text) const {
    std::string p = dir / name;
    write_text(p, text);
    return p;
  }
  CliResult run(std::vector<std::string> args, std::vector<std::string> extra_env = {}) const {
    auto e = env();
    e.insert(e.end(), extra_env.begin(), extra_env.end());
    return run_scalelab(args, dir.path(), e);
  }
};

const char* const kGrid = R"(
name = "grid"
repeats = 2
[parameters]
model = "llama-small"
seq_len = 256
device_memory = "2GiB"
micro_batch_size = [1, 4, 64]
)";

TEST(CliSweep, NativeRunsResumesAndIsReproducibleFromTheDatabase) {
  Lab lab;
  std::string spec = lab.spec("grid.toml", kGrid);
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(train_calls(lab.calls), 6);
  EXPECT_THAT(r.err, HasSubstr("[6/6]"));  // plain progress lines: stderr is not a terminal
  EXPECT_THAT(r.err, HasSubstr("4 ok, 2 oom, 0 failed"));
  EXPECT_THAT(r.out, HasSubstr("| micro_batch_size |"));

  // Resume: nothing left to run.
  CliResult again = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(train_calls(lab.calls), 6);
  EXPECT_THAT(again.err, HasSubstr("6 of 6 trials already in"));
  EXPECT_EQ(again.out, r.out);

  // The same table from the database alone, and as JSON.
  CliResult table = lab.run({"results", "--db", lab.db, "--sweep", "grid"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_EQ(table.out, r.out);
  CliResult js = lab.run({"results", "--db", lab.db, "--sweep", "grid", "--format", "json"});
  Json rows = Json::parse(js.out);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["micro_batch_size"], 1);
  EXPECT_EQ(rows[0]["runs"], 2);
  EXPECT_EQ(rows[0]["status"], "ok");
  EXPECT_GT(rows[1]["tokens_per_s_per_device"].get<double>(), rows[0]["tokens_per_s_per_device"].get<double>());
  EXPECT_EQ(rows[2]["status"], "oom");
  EXPECT_THAT(rows[2]["reason"].get<std::string>(), HasSubstr("out of cpu memory"));

  CliResult csv = lab.run({"results", "--db", lab.db, "--sweep", "grid", "--view", "trials", "--where", "status=oom",
                           "--format", "csv"});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 3);  // header + 2 trials

  // Trials are full records: config, command, log, host, version.
  ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
  auto trials = store.trials();
  ASSERT_EQ(trials.size(), 6u);
  EXPECT_THAT(trials[0].command, HasSubstr("train"));
  EXPECT_THAT(trials[0].command, HasSubstr("--micro-batch-size 1"));
  EXPECT_TRUE(fs::exists(trials[0].log_path));
  EXPECT_THAT(read_text(trials[0].log_path), HasSubstr("Training throughput"));
  EXPECT_FALSE(trials[0].host.empty());
  EXPECT_FALSE(trials[0].scalelab_version.empty());
  EXPECT_TRUE(trials[0].record.contains("losses"));

  // --retry-failed re-runs errors and timeouts only (an OOM is a result); --rerun runs everything.
  lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--retry-failed"});
  EXPECT_EQ(train_calls(lab.calls), 6);
  CliResult rerun = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--rerun"});
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_EQ(train_calls(lab.calls), 12);
  ResultsStore after(lab.db, ResultsStore::Mode::kReadOnly);
  EXPECT_EQ(after.trials().size(), 6u);
  EXPECT_EQ(after.trials(0, true).size(), 12u);
}

// [oom_search]: after its trials, each configuration's largest micro-batch, found with real trials
// from the engine's plan (the fake engine's limit for llama-small at 2 GiB is 14), reusing the
// sweep's own trial where one matches; a column of the summary; nothing re-run on resume.
TEST(CliSweep, OomSearchPerConfiguration) {
  Lab lab;
  std::string spec = lab.spec("methods.toml", R"(
name = "methods"
[parameters]
model = ["llama-small", "llama-tiny"]
seq_len = 256
device_memory = "2GiB"
micro_batch_size = [4, 14]
[oom_search]
max_micro_batch = 16
)");
  CliResult dry = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--dry-run"});
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("then 2 OOM search(es)"));
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("then 2 OOM search(es)"));
  Json rows = Json::parse(r.out);
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    if (row["model"] == "llama-small") EXPECT_EQ(row["max_micro_batch_size"], "14") << row.dump();
    else EXPECT_EQ(row["max_micro_batch_size"], ">= 16") << row.dump();  // the cap (its limit is 21)
    EXPECT_EQ(row["runs"], 1) << row.dump();  // the search's trials are not the sweep's rows
  }
  // llama-small: 14 (the sweep's own trial, reused) and 15; llama-tiny: from its plan to the cap.
  const int calls = train_calls(lab.calls);
  ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
  int searched = 0;
  for (const auto& t : store.trials())
    if (t.role == "oom-search") ++searched;
  EXPECT_EQ(calls, 4 + searched);
  EXPECT_GE(searched, 2);
  auto sw = store.find_sweep("methods");
  ASSERT_TRUE(sw.has_value());
  ASSERT_EQ(sw->result["oom_limits"].size(), 2u);
  EXPECT_EQ(sw->result["oom_limits"][0]["max_micro_batch_size"], 14);
  EXPECT_EQ(sw->result["oom_limits"][0]["params"]["model"], "llama-small");
  // Resume: everything is recorded, no trial runs again; the table is the same from the database.
  CliResult again = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--format", "json"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(train_calls(lab.calls), calls);
  EXPECT_EQ(again.out, r.out);
  CliResult table = lab.run({"results", "--db", lab.db, "--sweep", "methods"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("max micro-batch"));
  EXPECT_THAT(table.out, HasSubstr(">= 16"));
  EXPECT_THAT(table.out, HasSubstr("stopped at [oom_search] max_micro_batch"));
}

TEST(CliSweep, DryRunPrintsCommandsOnly) {
  Lab lab;
  std::string spec = lab.spec("grid.toml", kGrid);
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", "/x/eng", "--dry-run"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("3 configurations x 2 repeats = 6 trials"));
  EXPECT_THAT(r.out, HasSubstr("/x/eng train --device-memory 2GiB --micro-batch-size 64 --model llama-small"));
  EXPECT_FALSE(fs::exists(lab.db));
  // The engine from the environment.
  CliResult env = lab.run({"sweep", spec, "--dry-run"}, {"SCALELAB_ENGINE=/y/eng"});
  EXPECT_THAT(env.out, HasSubstr("/y/eng train --device-memory 2GiB"));
  // A native sweep refuses an engine that does not exist before running anything.
  CliResult missing = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.dir / "no-engine"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("is not an executable file"));
}

TEST(CliSweep, AnEditedSpecReusesMatchingTrialsAndShowsItsOwnConfigurations) {
  Lab lab;
  std::string spec = lab.spec("grid.toml", kGrid);
  ASSERT_EQ(lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine}).code, 0);
  EXPECT_EQ(train_calls(lab.calls), 6);
  write_text(spec, R"(
name = "grid"
[parameters]
model = "llama-small"
seq_len = 256
device_memory = "2GiB"
micro_batch_size = [4, 64, 2]
)");
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(train_calls(lab.calls), 7);  // only micro-batch 2 is new
  Json rows = Json::parse(r.out);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["micro_batch_size"], 4);  // spec order, one repeat each
  EXPECT_EQ(rows[1]["micro_batch_size"], 64);
  EXPECT_EQ(rows[2]["micro_batch_size"], 2);
  for (const auto& row : rows) EXPECT_EQ(row["runs"], 1);
}

TEST(CliSweep, ExternalTrialsThatFailInEveryWayDoNotStopTheSweep) {
  Lab lab;
  std::string workload = fake_workload(lab.dir);
  std::string spec = lab.spec("ext.toml", R"(
name = "ext"
timeout = 3
[workload]
type = "external"
command = ")" + workload + R"( --batch_size {micro_batch_size} {case}"
[workload.map.case]
fine = ""
oom = "--oom_above 0"
silent = "--no_metrics"
hang = "--hang --ignore_sigterm"
crash = "--crash"
[parameters]
micro_batch_size = 4
case = ["fine", "oom", "silent", "hang", "crash"]
)");
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--kill-grace", "0.3", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json rows = Json::parse(r.out);
  ASSERT_EQ(rows.size(), 5u);
  std::map<std::string, Json> by_case;
  for (const auto& row : rows) by_case[row["case"].get<std::string>()] = row;
  EXPECT_EQ(by_case["fine"]["status"], "ok");
  EXPECT_NEAR(by_case["fine"]["tokens_per_s_per_device"].get<double>(), 666.67, 0.01);
  EXPECT_NEAR(by_case["fine"]["memory_gib"].get<double>(), 48.0, 1e-9);
  EXPECT_EQ(by_case["oom"]["status"], "oom");
  EXPECT_THAT(by_case["oom"]["reason"].get<std::string>(), HasSubstr("torch.OutOfMemoryError: CUDA out of memory"));
  EXPECT_EQ(by_case["silent"]["status"], "error");
  EXPECT_THAT(by_case["silent"]["reason"].get<std::string>(), HasSubstr("no tokens_per_s_per_device"));
  EXPECT_EQ(by_case["hang"]["status"], "timeout");
  EXPECT_THAT(by_case["hang"]["reason"].get<std::string>(), HasSubstr("timed out after 3.0 s"));
  EXPECT_EQ(by_case["crash"]["status"], "error");
  EXPECT_THAT(by_case["crash"]["reason"].get<std::string>(), HasSubstr("exit code 1: RuntimeError: NCCL error"));
  // The hung trial's group is gone.
  EXPECT_TRUE(eventually([&] { return !process_mentions({"fake_workload.py", "--hang"}); }, 5));
}

TEST(CliSweep, KilledRunnerLosesAtMostTheRunningTrial) {
  Lab lab;
  std::string spec = lab.spec("slow.toml", R"(
name = "slow"
[parameters]
model = "llama-tiny"
micro_batch_size = [1, 2, 3, 4, 5]
)");
  std::vector<std::string> args = {"sweep", spec, "--db", lab.db, "--engine", lab.engine};
  auto env = lab.env();
  env.push_back("FAKE_ENGINE_HANG_ABOVE=2");  // the third trial never ends
  pid_t pid = start_scalelab(args, lab.dir.path(), env, lab.dir / "a.out", lab.dir / "a.err");
  const std::vector<std::string> hung_trial = {"fake_engine.py", "--micro-batch-size 3", lab.dir.path()};
  // The third trial is running (it has logged its call) when the runner is killed.
  ASSERT_TRUE(eventually([&] { return train_calls(lab.calls) == 3 && process_mentions(hung_trial); }, 30))
      << read_text(lab.dir / "a.err");
  ::kill(pid, SIGKILL);
  wait_exit(pid);
  // The running trial died with its runner (PR_SET_PDEATHSIG), and the database is intact.
  EXPECT_TRUE(eventually([&] { return !process_mentions(hung_trial); }, 10));
  EXPECT_EQ(integrity(lab.db), "ok");
  EXPECT_EQ(trial_count(lab.db), 2u);
  EXPECT_EQ(train_calls(lab.calls), 3);

  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 of 5 trials already in"));
  EXPECT_EQ(train_calls(lab.calls), 6);
  ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
  auto trials = store.trials(0, true);
  ASSERT_EQ(trials.size(), 5u);
  std::set<std::string> hashes;
  for (const auto& t : trials) {
    hashes.insert(t.config_hash);
    EXPECT_EQ(t.status, TrialStatus::kOk);
  }
  EXPECT_EQ(hashes.size(), 5u);
}

TEST(CliSweep, CtrlCKillsTheRunningTrialAndKeepsTheFinishedOnes) {
  Lab lab;
  std::string spec = lab.spec("slow.toml", "name = \"slow\"\n[parameters]\nmodel = \"llama-tiny\"\nmicro_batch_size = [1, 2, 3, 4]\n");
  auto env = lab.env();
  env.push_back("FAKE_ENGINE_SLEEP=0.5");
  pid_t pid = start_scalelab({"sweep", spec, "--db", lab.db, "--engine", lab.engine}, lab.dir.path(), env,
                             lab.dir / "a.out", lab.dir / "a.err");
  ASSERT_TRUE(eventually([&] { return trial_count(lab.db) >= 1; }, 30)) << read_text(lab.dir / "a.err");
  const std::vector<std::string> trial_process = {"fake_engine.py", lab.dir.path()};
  ASSERT_TRUE(eventually([&] { return process_mentions(trial_process); }, 10));
  ::kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 130);
  EXPECT_THAT(read_text(lab.dir / "a.err"), HasSubstr("interrupted"));
  EXPECT_THAT(read_text(lab.dir / "a.err"), HasSubstr("run the same command again to resume"));
  EXPECT_TRUE(eventually([&] { return !process_mentions(trial_process); }, 5));  // killed with its group
  std::size_t done = trial_count(lab.db);
  EXPECT_GE(done, 1u);
  EXPECT_LT(done, 4u);
  EXPECT_EQ(integrity(lab.db), "ok");
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(trial_count(lab.db), 4u);
}

TEST(CliSweep, TwoRunnersOnOneDatabase) {
  Lab lab;
  std::string slow = lab.spec("slow.toml", "name = \"slow\"\n[parameters]\nmodel = \"llama-tiny\"\nmicro_batch_size = [1, 2, 3]\n");
  std::string quick = lab.spec("quick.toml", "name = \"quick\"\n[parameters]\nmodel = \"llama-tiny\"\nmicro_batch_size = [1, 2]\n");
  auto env = lab.env();
  env.push_back("FAKE_ENGINE_SLEEP=0.5");
  pid_t a = start_scalelab({"sweep", slow, "--db", lab.db, "--engine", lab.engine}, lab.dir.path(), env,
                           lab.dir / "a.out", lab.dir / "a.err");
  std::string lock = lock_path_for(lab.db);
  ASSERT_TRUE(eventually([&] { return !read_text(lock).empty(); }, 30));

  CliResult refused = lab.run({"sweep", quick, "--db", lab.db, "--engine", lab.engine});
  EXPECT_EQ(refused.code, 1);
  EXPECT_THAT(refused.err, HasSubstr("is in use by pid " + std::to_string(a)));
  EXPECT_THAT(refused.err, HasSubstr("sweep slow"));
  EXPECT_THAT(refused.err, HasSubstr("--wait"));

  CliResult waited = lab.run({"sweep", quick, "--db", lab.db, "--engine", lab.engine, "--wait"});
  EXPECT_EQ(waited.code, 0) << waited.err;
  EXPECT_THAT(waited.err, HasSubstr("waiting for"));
  EXPECT_EQ(wait_exit(a), 0) << read_text(lab.dir / "a.err");
  EXPECT_EQ(integrity(lab.db), "ok");
  EXPECT_EQ(trial_count(lab.db), 5u);
  // A reader does not need the lock.
  EXPECT_EQ(lab.run({"results", "--db", lab.db}).code, 0);
}

TEST(CliBadInput, EveryCaseExitsTwoWithAClearMessage) {
  Lab lab;
  auto expect2 = [&](const std::vector<std::string>& args, const std::string& needle) {
    CliResult r = lab.run(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(needle));
  };
  expect2({"sweep", lab.spec("a.toml", "name = \"x\"\n[parameters]\nmicro_batch_size = [1, 2\n"), "--db", lab.db},
          "malformed TOML");
  expect2({"sweep", lab.spec("b.toml", "[parameters]\na = 1\n[workload]\ntyp = \"native\"\n"), "--db", lab.db},
          "b.toml:4:1] unknown key 'typ'");
  expect2({"sweep", lab.spec("c.toml", "[parameters]\nmicro_batch_size = []\n"), "--db", lab.db}, "empty list");
  expect2({"sweep", lab.spec("d.toml", "[workload]\ntype = \"external\"\ncommand = \"x {nproc}\"\n[parameters]\na = 1\n"),
           "--db", lab.db},
          "placeholder {nproc}");
  expect2({"sweep", lab.spec("e.toml", "[workload]\ntype = \"external\"\ncommand = \"x {a}\"\noom_pattern = \"([\"\n"
                                       "[parameters]\na = 1\n"),
           "--db", lab.db},
          "does not compile");
  std::string ok_spec = lab.spec("ok.toml", "[parameters]\nmodel = \"llama-tiny\"\n");
  write_text(lab.dir / "file", "x");
  expect2({"sweep", ok_spec, "--db", lab.dir / "file/sub/r.db", "--engine", lab.engine}, "cannot create");
  expect2({"results", "--db", lab.dir / "none.db"}, "no results database");

  { ResultsStore s(lab.db, ResultsStore::Mode::kReadWrite); }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(lab.db.c_str(), &db), SQLITE_OK);
  sqlite3_exec(db, "INSERT INTO schema_version VALUES (2, 'future')", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  expect2({"sweep", ok_spec, "--db", lab.db, "--engine", lab.engine}, "newer than this scalelab understands");
  expect2({"results", "--db", lab.db}, "schema version 2");

  std::string db2 = lab.dir / "r2.db";
  ASSERT_EQ(lab.run({"sweep", ok_spec, "--db", db2, "--engine", lab.engine}).code, 0);
  expect2({"results", "--db", db2, "--where", "status"}, "cannot read the filter");
  expect2({"results", "--db", db2, "--sweep", "ok", "--where", "statsu=ok"}, "no row has a field 'statsu'");
  expect2({"results", "--db", db2, "--sweep", "nope"}, "no sweep 'nope'");
  expect2({"results", "--db", db2, "--format", "xml"}, "unknown format");
  expect2({"oom-search", "--db", db2, "--engine", lab.engine, "--model", "llama-tiny", "--micro-batch-size", "4"},
          "--start");
  expect2({"ladder", "--db", db2, "--engine", lab.engine, "--model", "llama-tiny", "--attn", "flash"},
          "sets --attn itself");
  expect2({"oom-search", "--db", db2, "--command", "run {micro_batch_size} {nproc}"}, "placeholder {nproc}");
  expect2({"oom-search", "--db", db2, "--command", "run {micro_batch_size}", "--metric", "x=([0-9]"}, "does not compile");
  expect2({"sweep", ok_spec, "--bogus"}, "--bogus");
}

TEST(CliOomSearch, NativeFromThePlanOrByBisection) {
  Lab lab;
  const std::vector<std::string> train = {"--model", "llama-small", "--seq-len", "256", "--device-memory", "2GiB"};
  auto args = [&](const std::string& db, std::vector<std::string> extra) {
    std::vector<std::string> a = {"oom-search", "--db", db, "--engine", lab.engine};
    a.insert(a.end(), train.begin(), train.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // With the memory plan: two trials verify it.
  CliResult r = lab.run(args(lab.db, {"--json", lab.dir / "oom.json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Largest micro-batch that fits: 14 (verified: 14 fits, 15 runs out of memory)"));
  EXPECT_THAT(r.out, HasSubstr("Memory plan estimate: 14"));
  EXPECT_EQ(train_calls(lab.calls), 2);
  EXPECT_THAT(read_text(lab.calls), HasSubstr("--max-steps 5"));  // the default for searches
  Json j = Json::parse(read_text(lab.dir / "oom.json"));
  EXPECT_EQ(j["max_micro_batch_size"], 14);
  EXPECT_EQ(j["probes"].size(), 2u);
  EXPECT_GT(j["best_metrics"]["tokens_per_s_per_device"].get<double>(), 0);
  std::string name = j["sweep"];
  CliResult again = lab.run({"results", "--db", lab.db, "--sweep", name});
  EXPECT_EQ(again.out, r.out);

  // A plan that is off still ends verified at the true limit.
  CliResult off = lab.run(args(lab.dir / "off.db", {}), {"FAKE_ENGINE_PLAN_OFFSET=5"});
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_THAT(off.out, HasSubstr("Largest micro-batch that fits: 14 (verified"));
  CliResult under = lab.run(args(lab.dir / "under.db", {}), {"FAKE_ENGINE_PLAN_OFFSET=-9"});
  EXPECT_THAT(under.out, HasSubstr("Largest micro-batch that fits: 14 (verified"));

  // Without a plan: doubling then bisection.
  CliResult np = lab.run(args(lab.dir / "np.db", {}), {"FAKE_ENGINE_NO_PLAN=1"});
  ASSERT_EQ(np.code, 0) << np.err;
  EXPECT_THAT(np.out, HasSubstr("Largest micro-batch that fits: 14 (verified"));
  EXPECT_THAT(np.out, HasSubstr("Memory plan: unavailable"));
  EXPECT_THAT(np.out, HasSubstr("|          16 | oom"));

  // Nothing fits: exit 3.
  CliResult none = lab.run({"oom-search", "--db", lab.dir / "none.db", "--engine", lab.engine, "--model", "llama-small",
                            "--device-memory", "100MiB"});
  EXPECT_EQ(none.code, 3) << none.err;
  EXPECT_THAT(none.out, HasSubstr("No micro-batch fits"));

  // A trial that hangs stops the search with the reason (exit 1).
  CliResult hang = lab.run(args(lab.dir / "hang.db", {"--no-plan", "--timeout", "3", "--kill-grace", "0.2"}),
                           {"FAKE_ENGINE_HANG_ABOVE=4"});
  EXPECT_EQ(hang.code, 1) << hang.err;
  EXPECT_THAT(hang.out, HasSubstr("The search stopped: the trial at micro-batch 8 ended with timeout"));
}

TEST(CliOomSearch, ExternalCommand) {
  Lab lab;
  std::string workload = fake_workload(lab.dir);
  CliResult r = lab.run({"oom-search", "--db", lab.db, "--command",
                         workload + " --batch_size {micro_batch_size} --seq_len {seq_len} --oom_above 6", "--seq-len",
                         "512", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json rows = Json::parse(r.out);
  EXPECT_THAT(r.err, HasSubstr("Largest micro-batch that fits: 6 (verified"));
  bool six_ok = false, seven_oom = false;
  for (const auto& row : rows) {
    six_ok = six_ok || (row["micro_batch_size"] == 6 && row["status"] == "ok");
    seven_oom = seven_oom || (row["micro_batch_size"] == 7 && row["status"] == "oom");
  }
  EXPECT_TRUE(six_ok);
  EXPECT_TRUE(seven_oom);
  ResultsStore store(lab.db, ResultsStore::Mode::kReadOnly);
  EXPECT_THAT(store.trials()[0].command, HasSubstr("--seq_len 512"));
}

TEST(CliLadder, NativeClimbsAndTheTableComesBackFromTheDatabase) {
  Lab lab;
  std::vector<std::string> args = {"ladder", "--db", lab.db, "--engine", lab.engine, "--model", "llama-small",
                                   "--seq-len", "256", "--device-memory", "2GiB", "--json", lab.dir / "ladder.json"};
  CliResult r = lab.run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = Json::parse(read_text(lab.dir / "ladder.json"));
  const Json& rungs = j["rungs"];
  ASSERT_EQ(rungs.size(), 9u);
  std::vector<int> batches;
  for (const auto& rung : rungs) {
    EXPECT_EQ(rung["status"], "ok") << rung.dump();
    batches.push_back(rung["micro_batch_size"].get<int>());
  }
  EXPECT_EQ(batches, (std::vector<int>{1, 14, 14, 14, 21, 21, 24, 24, 217}));
  EXPECT_EQ(rungs[3]["model_precision"], "bf16");
  EXPECT_EQ(rungs[5]["attn"], "flash");
  EXPECT_EQ(rungs[7]["fused_kernels"], "yes");
  EXPECT_DOUBLE_EQ(rungs[0]["speedup"].get<double>(), 1.0);
  EXPECT_GT(rungs[8]["speedup"].get<double>(), 5.0);
  EXPECT_THAT(r.out, HasSubstr("Largest single jump: 'baseline, max batch'"));
  EXPECT_THAT(r.out, HasSubstr("| rung"));
  EXPECT_THAT(r.out, HasSubstr("tokens/s/device"));

  int calls = train_calls(lab.calls);
  CliResult again = lab.run(args);  // resumes from the database: no new trials
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(train_calls(lab.calls), calls);
  EXPECT_EQ(again.out, r.out);
  CliResult from_db = lab.run({"results", "--db", lab.db, "--sweep", j["sweep"].get<std::string>()});
  EXPECT_EQ(from_db.out, r.out);
  CliResult filtered = lab.run({"results", "--db", lab.db, "--sweep", j["sweep"].get<std::string>(), "--where",
                                "micro_batch_size>20", "--format", "csv"});
  EXPECT_EQ(std::count(filtered.out.begin(), filtered.out.end(), '\n'), 6);  // header + 5 rungs (21, 21, 24, 24, 217)
}

TEST(CliLadder, ASwitchTheEngineRefusesIsNotApplicable) {
  Lab lab;
  CliResult r = lab.run({"ladder", "--db", lab.db, "--engine", lab.engine, "--model", "llama-small", "--seq-len", "256",
                         "--device-memory", "2GiB", "--format", "json"},
                        {"FAKE_ENGINE_REFUSE=attn"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json rows = Json::parse(r.out);
  ASSERT_EQ(rows.size(), 9u);
  EXPECT_EQ(rows[5]["status"], "n/a");
  EXPECT_THAT(rows[5]["note"].get<std::string>(), HasSubstr("refused it"));
  EXPECT_THAT(rows[5]["note"].get<std::string>(), HasSubstr("--attn flash is not supported"));
  EXPECT_EQ(rows[6]["status"], "n/a");
  EXPECT_EQ(rows[7]["status"], "ok");  // fused kernels still climb on eager attention
  EXPECT_EQ(rows[7]["attn"], "eager");
}

TEST(CliLadder, ExternalCommandWithoutAnAttentionPlaceholder) {
  Lab lab;
  std::string workload = fake_workload(lab.dir);
  std::string spec = lab.spec("bench.toml", R"(
name = "bench"
[workload]
type = "external"
command = ")" + workload + R"( --batch_size {micro_batch_size} --model_precision {model_precision} --mixed_precision {mixed_precision} {fused_kernels} --memory_gb 40"
[workload.map.fused_kernels]
true = "--use_liger"
false = ""
)");
  CliResult r = lab.run({"ladder", "--db", lab.db, "--spec", spec, "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json rows = Json::parse(r.out);
  ASSERT_EQ(rows.size(), 9u);
  EXPECT_EQ(rows[1]["micro_batch_size"], 3);  // (40 - 16) / 8 per sample
  EXPECT_EQ(rows[5]["status"], "n/a");
  EXPECT_EQ(rows[5]["note"], "the command template has no {attn} placeholder");
  EXPECT_EQ(rows[6]["status"], "n/a");
  EXPECT_EQ(rows[7]["status"], "ok");
  EXPECT_EQ(rows[8]["status"], "ok");
  EXPECT_GT(rows[8]["micro_batch_size"].get<int>(), rows[4]["micro_batch_size"].get<int>());
}

}  // namespace
}  // namespace scalelab::lab

namespace scalelab::lab {
namespace {

TEST(CliResults, TelemetrySamplesExportInLongFormat) {
  testing::TempDir dir;
  std::string db = dir / "r.db";
  {
    ResultsStore s(db, ResultsStore::Mode::kReadWrite);
    std::int64_t sw = s.ensure_sweep("t", "sweep", {});
    TrialRecord r;
    r.config_hash = "h";
    r.config = {{"params", {{"micro_batch_size", 1}}}};
    r.status = TrialStatus::kOk;
    r.started_at = r.ended_at = utc_now_iso();
    std::int64_t id = s.insert_trial(sw, r);
    s.insert_telemetry_samples(id, {{0, 0.0, "nvml", "0", "power_w", 250.5}, {0, 0.2, "nvml", "0", "power_w", 260.0},
                                    {0, 0.2, "process", "host", "rss_bytes", 1e9}});
  }
  testing::CliResult r = testing::run_scalelab({"results", "--db", db, "--sweep", "t", "--view", "telemetry",
                                                "--format", "csv", "--where", "metric=power_w"},
                                               dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "trial_id,t_s,source,device,metric,value\n1,0.0,nvml,0,power_w,250.5\n1,0.2,nvml,0,power_w,260.0\n");
}

}  // namespace
}  // namespace scalelab::lab

namespace scalelab::lab {
namespace {

// Every trial is sampled by default: its process tree's samples and the summary are stored with
// it and export from the database; --no-telemetry stores none.
TEST(CliSweep, TrialsAreSampledAndTheSamplesStored) {
  Lab lab;
  const std::string spec = lab.spec("tel.toml", R"(
name = "tel"
[parameters]
model = "llama-small"
seq_len = 256
device_memory = "2GiB"
micro_batch_size = [1, 2]
)");
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", lab.engine, "--telemetry-interval", "20"},
                        {"FAKE_ENGINE_SLEEP=0.3"});
  ASSERT_EQ(r.code, 0) << r.err;
  CliResult samples = lab.run({"results", "--db", lab.db, "--sweep", "tel", "--view", "telemetry", "--format", "csv",
                               "--where", "source=process"});
  ASSERT_EQ(samples.code, 0) << samples.err;
  EXPECT_THAT(samples.out, HasSubstr("rss_bytes"));
  EXPECT_GT(std::count(samples.out.begin(), samples.out.end(), '\n'), 4);
  {
    ResultsStore s(lab.db, ResultsStore::Mode::kReadOnly);
    const auto rows = s.trials(s.find_sweep("tel").value().sweep_id);
    ASSERT_EQ(rows.size(), 2u);
    for (const auto& row : rows) EXPECT_TRUE(row.telemetry_summary.contains("process")) << row.telemetry_summary.dump();
  }
  const std::string spec2 = lab.spec("tel2.toml", R"(
name = "tel2"
[parameters]
model = "llama-small"
micro_batch_size = [1]
)");
  ASSERT_EQ(lab.run({"sweep", spec2, "--db", lab.db, "--engine", lab.engine, "--no-telemetry"}).code, 0);
  CliResult none = lab.run({"results", "--db", lab.db, "--sweep", "tel2", "--view", "telemetry", "--format", "csv"});
  EXPECT_EQ(std::count(none.out.begin(), none.out.end(), '\n'), 1) << none.out;  // the header only
}

// --profile: each native trial runs the real engine with --profile and --trace; its op-family
// summary is stored with it and `results --view profile` shows the trials side by side; an
// external workload is refused (exit 2) before anything runs.
TEST(CliSweep, ProfiledTrialsStoreTheirSummariesAndTimelines) {
  Lab lab;
  const std::string spec = lab.spec("prof.toml", R"(
name = "prof"
[parameters]
model = "llama-tiny"
seq_len = 16
max_steps = 3
threads = 1
attn = ["eager", "flash"]
)");
  CliResult r = lab.run({"sweep", spec, "--db", lab.db, "--engine", SCALELAB_EXE, "--profile", "--no-telemetry"});
  ASSERT_EQ(r.code, 0) << r.err;
  {
    ResultsStore s(lab.db, ResultsStore::Mode::kReadOnly);
    const auto rows = s.trials(s.find_sweep("prof").value().sweep_id);
    ASSERT_EQ(rows.size(), 2u);
    for (const auto& row : rows) {
      EXPECT_THAT(row.command, HasSubstr("--profile --trace"));
      ASSERT_TRUE(row.record.contains("profile")) << row.record.dump();
      EXPECT_TRUE(row.record["profile"].contains("summary"));
      const std::string trace = (fs::path(row.log_path).parent_path() /
                                 (fs::path(row.log_path).stem().string() + ".trace.json")).string();
      ASSERT_TRUE(fs::exists(trace)) << trace;
      EXPECT_TRUE(Json::parse(read_text(trace)).contains("traceEvents"));
    }
  }
  CliResult view = lab.run({"results", "--db", lab.db, "--sweep", "prof", "--view", "profile", "--format", "json"});
  ASSERT_EQ(view.code, 0) << view.err;
  const Json rows = Json::parse(view.out);
  ASSERT_EQ(rows.size(), 2u);
  std::set<std::string> attns;
  for (const auto& row : rows) {
    attns.insert(row["attn"].get<std::string>());
    EXPECT_GT(row["step_time_s"].get<double>(), 0.0);
    ASSERT_TRUE(row.contains("pct_matmul")) << row.dump();
    ASSERT_TRUE(row.contains("pct_attention")) << row.dump();
    double sum = 0;
    for (const auto& [k, v] : row.items())
      if (k.rfind("pct_", 0) == 0) sum += v.get<double>();
    EXPECT_NEAR(sum, 100.0, 1e-6) << row.dump();  // the shares of one trial's op families
  }
  EXPECT_EQ(attns, (std::set<std::string>{"eager", "flash"}));
  CliResult md = lab.run({"results", "--db", lab.db, "--sweep", "prof", "--view", "profile"});
  EXPECT_THAT(md.out, HasSubstr("matmul %"));

  // An unprofiled sweep's trials are counted as such; an external workload refuses --profile.
  const std::string plain = lab.spec("plain.toml", "name = \"plain\"\n[parameters]\nmodel = \"llama-small\"\n");
  ASSERT_EQ(lab.run({"sweep", plain, "--db", lab.db, "--engine", lab.engine, "--no-telemetry"}).code, 0);
  CliResult none = lab.run({"results", "--db", lab.db, "--sweep", "plain", "--view", "profile"});
  EXPECT_THAT(none.out + none.err, HasSubstr("1 trial(s) without a profile"));
  const std::string ext = lab.spec("ext.toml", "name = \"ext\"\n[parameters]\na = [1]\n[workload]\ntype = \"external\"\ncommand = \"true {a}\"\n");
  CliResult refused = lab.run({"sweep", ext, "--db", lab.db, "--profile"});
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("profile-summary"));
}

}  // namespace
}  // namespace scalelab::lab
