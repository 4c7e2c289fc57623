// Profiles of external workloads ([workload] profile = "nsys" / "torch"): the spec keys, how the
// command is wrapped (whole, or per rank behind a launcher), what is stored with the trial, and
// that a profile that fails never loses the trial. nsys is tests/lab/fake_nsys.sh on PATH (it runs
// the command, writes a placeholder report, and `stats` prints the committed CSV fixture
// tests/profile/data/nsys_stats.csv); mpirun, where one is needed, is tests/lab/fake_mpirun.sh.
#include "lab/external_profile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "lab/executor.h"
#include "lab/spec.h"
#include "lab/views.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using ::testing::Not;
using ::testing::StartsWith;
using testing::TempDir;
using testing::read_text;
using testing::source_path;
using testing::write_text;

const std::string kStatsCsv = source_path("tests/profile/data/nsys_stats.csv");

// The fixture's figures (tests/profile/data/nsys_stats.csv), in seconds: cudaLaunchKernel; the
// two synchronize calls; host-to-device copies; the NCCL kernel.
constexpr double kLaunchS = 2000000e-9;
constexpr double kSyncS = (5000000 + 200000) * 1e-9;
constexpr double kHtodS = 400000e-9;
constexpr double kNcclS = 2000000e-9;

void install(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  fs::permissions(to, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
}

// Sets an environment variable for the test's lifetime (trials inherit the runner's environment).
class EnvGuard {
 public:
  EnvGuard(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~EnvGuard() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A directory with the fake nsys (and mpirun) first on PATH.
struct FakeTools {
  TempDir dir;
  std::string bin = dir / "bin";
  std::string calls = dir / "nsys-calls.txt";
  std::optional<EnvGuard> path, csv, log;
  FakeTools() {
    fs::create_directories(bin);
    install(source_path("tests/lab/fake_nsys.sh"), bin + "/nsys");
    install(source_path("tests/lab/fake_mpirun.sh"), bin + "/mpirun");
    const char* old = std::getenv("PATH");
    path.emplace("PATH", bin + ":" + (old ? old : "/usr/bin:/bin"));
    csv.emplace("FAKE_NSYS_STATS_CSV", kStatsCsv);
    log.emplace("FAKE_NSYS_LOG", calls);
  }
};

struct Fixture {
  TempDir dir;
  ResultsStore store{dir / "r.db", ResultsStore::Mode::kReadWrite};
  std::int64_t sweep = store.ensure_sweep("s", "sweep", {});
  LabOptions options() {
    LabOptions o;
    o.db_path = dir / "r.db";
    o.timeout_s = 30;
    return o;
  }
};

// An external workload from a [workload] table's body.
Workload workload_of(const std::string& body) {
  return parse_sweep_spec("[workload]\ntype = \"external\"\n" + body + "\n[parameters]\ntps = [5]\n", "spec.toml")
      .workload;
}

std::string spec_error(const std::string& body) {
  try {
    workload_of(body);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "(no error)";
}

// Prints the throughput given as {tps}; a negative value fails like a crash.
const std::string kEchoCommand =
    R"(command = "if [ {tps} -lt 0 ]; then echo boom; exit 1; fi; echo \"Training throughput: {tps} tokens/s\"")";
const std::string kEcho = kEchoCommand + "\nprofile = \"nsys\"";

TEST(ExternalProfile, SpecKeys) {
  EXPECT_EQ(workload_of("command = \"true\"").profile.tool, ProfileTool::kNone);
  Workload n = workload_of("command = \"true\"\nprofile = \"nsys?\"\nprofile_args = [\"--sample=none\"]");
  EXPECT_EQ(n.profile.tool, ProfileTool::kNsys);
  EXPECT_TRUE(n.profile.optional);
  EXPECT_EQ(n.profile.args, std::vector<std::string>{"--sample=none"});
  EXPECT_EQ(n.identity()["profile"], "nsys");  // "nsys?" measures the same thing
  EXPECT_EQ(workload_of("command = \"true\"\nprofile = \"torch\"").profile.tool, ProfileTool::kTorch);
  // Profiling changes the configuration's identity (a profiled trial is another measurement);
  // an unprofiled spec's identity is as before.
  EXPECT_FALSE(workload_of("command = \"true\"").identity().contains("profile"));

  EXPECT_THAT(spec_error("command = \"true\"\nprofile = \"perf\""), HasSubstr("workload.profile is 'perf'"));
  EXPECT_THAT(spec_error("command = \"true\"\nprofile_args = [\"-x\"]"), HasSubstr("needs profile = \"nsys\""));
  EXPECT_THAT(spec_error("command = \"true\"\nprofile = \"nsys\"\nprofile_rank_env = \"a b\""),
              HasSubstr("environment variable name"));
  // A launcher in front without {profiler}: nsys would profile the launcher, not the ranks.
  EXPECT_THAT(spec_error("command = \"mpirun -np 2 python3 train.py\"\nprofile = \"nsys\""),
              HasSubstr("put {profiler} where each rank's program begins"));
  EXPECT_THAT(spec_error("command = [\"OMP_NUM_THREADS=1\", \"/usr/bin/srun\", \"python3\"]\nprofile = \"nsys\""),
              HasSubstr("srun"));
  EXPECT_THAT(spec_error("command = [\"mpirun\", \"x{profiler}\"]\nprofile = \"nsys\""),
              HasSubstr("a word of its own"));
  EXPECT_EQ(spec_error("command = \"mpirun -np 2 {profiler} python3 train.py\"\nprofile = \"nsys\""), "(no error)");
  // The native engine is profiled with --profile.
  try {
    parse_sweep_spec("[workload]\ntype = \"native\"\nprofile = \"nsys\"\n[parameters]\nmodel = \"llama-small\"\n",
                     "spec.toml");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr("--profile"));
  }
}

TEST(ExternalProfile, WrapsTheWholeCommandOrEachRank) {
  TrialContext ctx;
  ctx.dir = "/logs/s";
  ctx.key = "abc-r0";
  ctx.nsys = true;
  const ParamMap params{{"tps", 5}};
  const std::vector<std::string> head = {"nsys", "profile", "-o", "/logs/s/abc-r0.profile/profile",
                                         "--force-overwrite=true", "--trace=cuda,nvtx,osrt"};

  // A shell command: nsys runs the shell, which runs the command (nsys follows its children).
  Launch l = build_launch(workload_of("command = \"torchrun x.py --bs {tps}\"\nprofile = \"nsys\""), "", params, ctx);
  std::vector<std::string> want = head;
  want.insert(want.end(), {"/bin/sh", "-c", "torchrun x.py --bs 5"});
  EXPECT_EQ(l.argv, want);
  EXPECT_THAT(l.display, StartsWith("nsys profile -o /logs/s/abc-r0.profile/profile --force-overwrite=true"));

  // A list command, with more nsys options.
  l = build_launch(workload_of("command = [\"python3\", \"x.py\"]\nprofile = \"nsys\"\nprofile_args = [\"--sample=none\"]"),
                   "", params, ctx);
  want = head;
  want.insert(want.end(), {"--sample=none", "python3", "x.py"});
  EXPECT_EQ(l.argv, want);

  // Behind mpirun: each rank under nsys, its report named by its rank, MPI traced.
  l = build_launch(workload_of("command = \"mpirun -np 2 {profiler} python3 x.py\"\nprofile = \"nsys\""), "", params, ctx);
  EXPECT_EQ(l.argv[0], "/bin/sh");
  EXPECT_EQ(l.argv[2],
            "mpirun -np 2 nsys profile -o '/logs/s/abc-r0.profile/profile.rank%q{OMPI_COMM_WORLD_RANK}' "
            "--force-overwrite=true --trace=cuda,nvtx,osrt,mpi python3 x.py");
  l = build_launch(workload_of("command = [\"srun\", \"{profiler}\", \"python3\"]\nprofile = \"nsys\""), "", params, ctx);
  want = {"srun", "nsys", "profile", "-o", "/logs/s/abc-r0.profile/profile.rank%q{SLURM_PROCID}",
          "--force-overwrite=true", "--trace=cuda,nvtx,osrt", "python3"};
  EXPECT_EQ(l.argv, want);
  l = build_launch(workload_of("command = \"mpirun {profiler} a\"\nprofile = \"nsys\"\nprofile_rank_env = \"PMI_RANK\""),
                   "", params, ctx);
  EXPECT_THAT(l.argv[2], HasSubstr("profile.rank%q{PMI_RANK}'"));
  // Another launcher of the user's: reports named by process id.
  l = build_launch(workload_of("command = \"my-launcher {profiler} a\"\nprofile = \"nsys\""), "", params, ctx);
  EXPECT_THAT(l.argv[2], HasSubstr("/profile.%p --force-overwrite=true"));

  // Not under nsys ("nsys?" without nsys, or no profile): {profiler} is empty, nothing wraps.
  ctx.nsys = false;
  l = build_launch(workload_of("command = [\"mpirun\", \"{profiler}\", \"a\"]\nprofile = \"nsys?\""), "", params, ctx);
  EXPECT_EQ(l.argv, (std::vector<std::string>{"mpirun", "a"}));
  l = build_launch(workload_of("command = \"echo {tps}\""), "", params, ctx);
  EXPECT_EQ(l.argv, (std::vector<std::string>{"/bin/sh", "-c", "echo 5"}));
}

TEST(ExternalProfile, StripsWhatNsysPrints) {
  const std::string log =
      "Collecting data...\nstep 1\nboom\nGenerating '/tmp/nsys-report-1a2b.qdstrm'\n"
      "[1/1] [========================100%] profile.nsys-rep\nGenerated:\n    /x/profile.nsys-rep\n"
      "The target application returned non-zero exit code 1\n";
  EXPECT_EQ(strip_nsys_lines(log), "step 1\nboom\n");
}

TEST(ExternalProfile, NsysSummariesAreStoredWithTheTrial) {
  FakeTools tools;
  Fixture f;
  TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
  auto r = exec.run({{"tps", 5}}, 0, "");
  ASSERT_EQ(r.row.status, TrialStatus::kOk) << r.row.reason;
  EXPECT_DOUBLE_EQ(r.row.metrics["tokens_per_s_per_device"].get<double>(), 5);
  EXPECT_THAT(r.row.command, StartsWith("nsys profile -o "));
  const Json& p = r.row.record.at("profile");
  EXPECT_EQ(p["tool"], "nsys");
  ASSERT_EQ(p["status"], "ok") << p.dump();
  const std::string dir = exec.log_dir() + "/" + r.row.config_hash.substr(0, 12) + "-r0.profile";
  EXPECT_EQ(p["dir"], dir);
  EXPECT_EQ(p["reports"], Json::array({dir + "/profile.nsys-rep"}));
  EXPECT_EQ(p["stats"], Json::array({dir + "/profile.stats.csv"}));
  EXPECT_TRUE(fs::exists(dir + "/profile.nsys-rep"));
  const Json& s = p["summary"];
  EXPECT_EQ(s["source"], "nsys");
  EXPECT_NEAR(s["derived"]["launch_api_s"].get<double>(), kLaunchS, 1e-15);
  EXPECT_NEAR(s["derived"]["sync_api_s"].get<double>(), kSyncS, 1e-15);
  EXPECT_NEAR(s["derived"]["memcpy_htod_s"].get<double>(), kHtodS, 1e-15);
  EXPECT_NEAR(s["derived"]["nccl_kernel_s"].get<double>(), kNcclS, 1e-15);
  std::set<std::string> tables;
  for (const auto& t : s["tables"]) tables.insert(t["id"].get<std::string>());
  EXPECT_EQ(tables, (std::set<std::string>{"cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum",
                                           "cuda_gpu_mem_size_sum"}));
  // nsys stats was asked for exactly the reports the study reads.
  EXPECT_THAT(read_text(tools.calls),
              HasSubstr("stats --format=csv --report=cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum,"
                        "cuda_gpu_mem_size_sum,nvtx_sum " + dir + "/profile.nsys-rep"));
  // The record survives the database round trip (what `results` reads).
  EXPECT_EQ(f.store.trial(r.row.trial_id)->record["profile"]["summary"], s);
}

TEST(ExternalProfile, TrialThatFailsUnderNsysKeepsItsReasonAndProfile) {
  FakeTools tools;
  Fixture f;
  TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
  auto r = exec.run({{"tps", -1}}, 0, "");
  EXPECT_EQ(r.row.status, TrialStatus::kError);
  EXPECT_EQ(r.row.exit_code, 1);
  EXPECT_EQ(r.row.reason, "exit code 1: boom");  // its own last line, not nsys's
  EXPECT_EQ(r.row.record["profile"]["status"], "ok");  // nsys wrote the report of the failed run
  EXPECT_TRUE(r.row.record["profile"]["summary"]["derived"].contains("launch_api_s"));
}

TEST(ExternalProfile, FailingNsysNeverLosesTheTrial) {
  FakeTools tools;
  Fixture f;
  {
    EnvGuard fail("FAKE_NSYS_STATS_FAIL", "1");
    TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
    auto r = exec.run({{"tps", 5}}, 0, "");
    EXPECT_EQ(r.row.status, TrialStatus::kOk);
    EXPECT_DOUBLE_EQ(r.row.metrics["tokens_per_s_per_device"].get<double>(), 5);
    const Json& p = r.row.record["profile"];
    EXPECT_EQ(p["status"], "failed");
    EXPECT_THAT(p["reason"].get<std::string>(), HasSubstr("nsys stats failed on "));
    EXPECT_THAT(p["reason"].get<std::string>(), HasSubstr("exit code 1: ERROR: "));
    EXPECT_THAT(p["reason"].get<std::string>(), HasSubstr("(fake failure)"));
    EXPECT_FALSE(p.contains("summary"));
  }
  {
    EnvGuard none("FAKE_NSYS_NO_REPORT", "1");
    TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
    auto r = exec.run({{"tps", 6}}, 0, "");
    EXPECT_EQ(r.row.status, TrialStatus::kOk);
    EXPECT_EQ(r.row.record["profile"]["status"], "failed");
    EXPECT_THAT(r.row.record["profile"]["reason"].get<std::string>(), HasSubstr("nsys wrote no report in "));
  }
  {
    // The stats are not a table nsys prints: the reader's message is the reason.
    const std::string junk = f.dir / "junk.csv";
    write_text(junk, "no tables here\n");
    EnvGuard csv("FAKE_NSYS_STATS_CSV", junk);
    TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
    auto r = exec.run({{"tps", 7}}, 0, "");
    EXPECT_EQ(r.row.status, TrialStatus::kOk);
    EXPECT_EQ(r.row.record["profile"]["status"], "failed");
    EXPECT_THAT(r.row.record["profile"]["reason"].get<std::string>(), HasSubstr("has no nsys stats table"));
  }
  EXPECT_EQ(f.store.trials(f.sweep).size(), 3u);
}

TEST(ExternalProfile, TrialKilledAtItsTimeoutUnderNsys) {
  FakeTools tools;
  Fixture f;
  LabOptions o = f.options();
  o.timeout_s = 0.5;
  o.kill_grace_s = 0.2;
  TrialExecutor exec(f.store, f.sweep, "s", workload_of("command = \"sleep {tps}\"\nprofile = \"nsys\""), o,
                     Progress::silent());
  auto r = exec.run({{"tps", 30}}, 0, "");
  EXPECT_EQ(r.row.status, TrialStatus::kTimeout);
  EXPECT_EQ(r.row.record["profile"]["status"], "failed");
  EXPECT_THAT(r.row.record["profile"]["reason"].get<std::string>(), HasSubstr("(the trial was stopped: timed out"));
}

TEST(ExternalProfile, NsysMissing) {
  TempDir empty;
  EnvGuard path("PATH", empty.path() + ":/usr/bin:/bin");
  if (!find_executable("nsys").empty()) GTEST_SKIP() << "a real nsys is in /usr/bin or /bin";
  Fixture f;
  try {
    TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
    ADD_FAILURE() << "ran without nsys";
  } catch (const InvalidInput& e) {
    EXPECT_THAT(e.what(), HasSubstr("nsys (Nsight Systems) is not on PATH"));
    EXPECT_THAT(e.what(), HasSubstr("profile = \"nsys?\""));
  }
  // "nsys?": the trials run unprofiled and say so.
  Workload optional = workload_of(kEchoCommand + "\nprofile = \"nsys?\"");
  TrialExecutor exec(f.store, f.sweep, "s", optional, f.options(), Progress::silent());
  auto r = exec.run({{"tps", 5}}, 0, "");
  EXPECT_EQ(r.row.status, TrialStatus::kOk);
  EXPECT_THAT(r.row.command, Not(HasSubstr("nsys")));
  EXPECT_EQ(r.row.record["profile"]["status"], "skipped");
  EXPECT_THAT(r.row.record["profile"]["reason"].get<std::string>(), HasSubstr("not on PATH"));
}

TEST(ExternalProfile, EachRankBehindALauncherWritesItsReport) {
  FakeTools tools;
  Fixture f;
  Workload w = workload_of(
      "command = \"mpirun -np 2 {profiler} sh -c 'echo \\\"Training throughput: {tps} tokens/s\\\"'\"\n"
      "profile = \"nsys\"");
  TrialExecutor exec(f.store, f.sweep, "s", w, f.options(), Progress::silent());
  auto r = exec.run({{"tps", 5}}, 0, "");
  ASSERT_EQ(r.row.status, TrialStatus::kOk) << r.row.reason << "\n" << read_text(r.row.log_path);
  const Json& p = r.row.record["profile"];
  ASSERT_EQ(p["status"], "ok") << p.dump();
  const std::string dir = p["dir"].get<std::string>();
  EXPECT_EQ(p["reports"], Json::array({dir + "/profile.rank0.nsys-rep", dir + "/profile.rank1.nsys-rep"}));
  ASSERT_EQ(p["ranks"].size(), 2u);
  EXPECT_EQ(p["ranks"][0]["rank"], 0);
  EXPECT_EQ(p["ranks"][1]["rank"], 1);
  EXPECT_NEAR(p["ranks"][1]["derived"]["launch_api_s"].get<double>(), kLaunchS, 1e-15);
  EXPECT_THAT(p["summary"]["file"].get<std::string>(), HasSubstr("profile.rank0.stats.csv"));
  EXPECT_THAT(read_text(tools.calls), HasSubstr("--trace=cuda,nvtx,osrt,mpi sh -c"));
  // The compare view says how many reports a trial's figures come from.
  Table t = profile_compare_table(f.store.trials(f.sweep), {}, {}, false);
  ASSERT_EQ(t.rows.size(), 1u);
  EXPECT_EQ(t.rows[0]["profile_ranks"], 2);
  EXPECT_TRUE(std::any_of(t.columns.begin(), t.columns.end(), [](const Column& c) { return c.key == "profile_ranks"; }));
}

TEST(ExternalProfile, TorchTraceWrittenWhereTheLabSays) {
  Fixture f;
  const std::string trace = source_path("tests/profile/data/torch_gpu_trace.json");
  Workload w = workload_of("command = \"if [ {tps} -gt 0 ]; then cp " + trace +
                           " \\\"$SCALELAB_TORCH_TRACE\\\"; fi; echo \\\"Training throughput: 5 tokens/s\\\"\"\n"
                           "profile = \"torch\"");
  TrialExecutor exec(f.store, f.sweep, "s", w, f.options(), Progress::silent());
  auto r = exec.run({{"tps", 1}}, 0, "");
  ASSERT_EQ(r.row.status, TrialStatus::kOk) << r.row.reason;
  const Json& p = r.row.record["profile"];
  ASSERT_EQ(p["status"], "ok") << p.dump();
  EXPECT_EQ(p["tool"], "torch");
  EXPECT_EQ(p["summary"]["source"], "pytorch");
  EXPECT_TRUE(p["summary"]["derived"].contains("launch_api_s"));
  EXPECT_TRUE(p["summary"]["derived"].contains("device_idle_fraction"));

  auto missing = exec.run({{"tps", 0}}, 0, "");  // writes no trace
  EXPECT_EQ(missing.row.status, TrialStatus::kOk);
  EXPECT_EQ(missing.row.record["profile"]["status"], "failed");
  EXPECT_THAT(missing.row.record["profile"]["reason"].get<std::string>(),
              HasSubstr("the workload wrote no trace at $SCALELAB_TORCH_TRACE"));
}

TEST(ExternalProfile, CompareViewLaysTheFiguresSideBySide) {
  FakeTools tools;
  Fixture f;
  TrialExecutor exec(f.store, f.sweep, "s", workload_of(kEcho), f.options(), Progress::silent());
  exec.run({{"tps", 5}}, 0, "");
  {
    EnvGuard fail("FAKE_NSYS_STATS_FAIL", "1");
    exec.run({{"tps", 6}}, 0, "");
  }
  Table t = profile_compare_table(f.store.trials(f.sweep), {}, {"tps"}, false);
  std::vector<std::string> keys;
  for (const auto& c : t.columns) keys.push_back(c.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"trial_id", "status", "tps", "tokens_per_s_per_device", "profile",
                                            "launch_api_s", "sync_api_s", "memcpy_htod_s", "memcpy_htod_mb",
                                            "memcpy_htod_gb_per_s", "nccl_kernel_s", "profile_reason"}));
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0]["profile"], "ok");
  EXPECT_NEAR(t.rows[0]["sync_api_s"].get<double>(), kSyncS, 1e-15);
  // The fixture's host-to-device copies: 83.886 MB in 400 us.
  EXPECT_NEAR(t.rows[0]["memcpy_htod_mb"].get<double>(), 83.886, 1e-12);
  EXPECT_NEAR(t.rows[0]["memcpy_htod_gb_per_s"].get<double>(), 83.886e-3 / kHtodS, 1e-9);
  EXPECT_EQ(t.rows[1]["profile"], "failed");
  EXPECT_FALSE(t.rows[1].contains("sync_api_s"));
  EXPECT_THAT(t.rows[1]["profile_reason"].get<std::string>(), HasSubstr("nsys stats failed"));
  // Filters see the profile's status.
  Table ok = profile_compare_table(f.store.trials(f.sweep), {parse_filter("profile=ok")}, {"tps"}, false);
  EXPECT_EQ(ok.rows.size(), 1u);

  // The profile view shows the external trials' GPU kernels, by time over the trials.
  Table kernels = profile_table(f.store.trials(f.sweep), {}, {"tps"});
  ASSERT_EQ(kernels.rows.size(), 1u);
  EXPECT_DOUBLE_EQ(kernels.rows[0]["pct_void gemm_kernel<float, 128, 64>(Params)"].get<double>(), 70.0);
  EXPECT_DOUBLE_EQ(kernels.rows[0]["pct_rmsnorm_forward_kernel"].get<double>(), 10.0);
  EXPECT_EQ(kernels.columns[3].key, "pct_void gemm_kernel<float, 128, 64>(Params)");
  EXPECT_THAT(kernels.notes, ::testing::Contains(HasSubstr("1 trial(s) without a profile")));
}

// The commands a user types: a sweep whose spec asks for nsys, the stored summaries in
// `results --view profile-compare` (one sweep, and every sweep side by side), nsys missing.
TEST(ExternalProfileCli, SweepUnderNsysAndCompareView) {
  FakeTools tools;
  TempDir dir;
  const std::string db = dir / "r.db";
  const std::string spec_text = "[workload]\ntype = \"external\"\n" + kEcho + "\n[parameters]\ntps = [5, 6]\n";
  write_text(dir / "a.toml", "name = \"a\"\n" + spec_text);
  write_text(dir / "b.toml", "name = \"b\"\n" + spec_text);
  const std::vector<std::string> env = {"PATH=" + std::string(std::getenv("PATH")), "FAKE_NSYS_STATS_CSV=" + kStatsCsv};

  testing::CliResult dry = testing::run_scalelab({"sweep", dir / "a.toml", "--dry-run"}, dir.path(), env);
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("nsys profile -o '<log-dir>/<trial>.profile/profile' --force-overwrite=true"));

  for (const char* name : {"a.toml", "b.toml"}) {
    testing::CliResult r =
        testing::run_scalelab({"sweep", dir / name, "--db", db, "--no-telemetry"}, dir.path(), env);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  testing::CliResult js = testing::run_scalelab(
      {"results", "--db", db, "--sweep", "a", "--view", "profile-compare", "--format", "json"}, dir.path());
  ASSERT_EQ(js.code, 0) << js.err;
  const Json rows = Json::parse(js.out);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    EXPECT_EQ(row["profile"], "ok");
    EXPECT_NEAR(row["launch_api_s"].get<double>(), kLaunchS, 1e-15);
    EXPECT_NEAR(row["memcpy_htod_s"].get<double>(), kHtodS, 1e-15);
  }
  testing::CliResult csv = testing::run_scalelab(
      {"results", "--db", db, "--sweep", "a", "--view", "profile-compare", "--format", "csv"}, dir.path());
  EXPECT_THAT(csv.out, StartsWith("trial_id,status,tps,tokens_per_s_per_device,profile,launch_api_s,sync_api_s,"
                                  "memcpy_htod_s,memcpy_htod_mb,memcpy_htod_gb_per_s,nccl_kernel_s\n"));
  // Across sweeps: every sweep's trials, a sweep column first.
  testing::CliResult all = testing::run_scalelab({"results", "--db", db, "--view", "profile-compare"}, dir.path());
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("| sweep | trial | status | tps |"));
  EXPECT_THAT(all.out, HasSubstr("launch API s"));
  EXPECT_EQ(std::count(all.out.begin(), all.out.end(), '\n') >= 6, true) << all.out;
  testing::CliResult kernels = testing::run_scalelab({"results", "--db", db, "--sweep", "b", "--view", "profile"}, dir.path());
  EXPECT_THAT(kernels.out, HasSubstr("rmsnorm_forward_kernel %"));

  // Without nsys the spec is refused before the database is touched.
  TempDir empty;
  testing::CliResult missing = testing::run_scalelab(
      {"sweep", dir / "a.toml", "--db", dir / "missing.db", "--name", "missing"}, dir.path(),
      {"PATH=" + empty.path() + ":/usr/bin:/bin"});
  if (!find_executable("nsys").empty() && fs::exists("/usr/bin/nsys")) GTEST_SKIP() << "a real nsys is installed";
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("nsys (Nsight Systems) is not on PATH"));
  EXPECT_FALSE(fs::exists(dir / "missing.db"));
}

}  // namespace
}  // namespace scalelab::lab
