// The scaling study's pieces without processes: its table from trial rows, its spec, and the
// launches of its two launchers (mpirun on this machine, an sbatch script for SLURM).
#include "lab/scale.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "lab/launchers.h"
#include "lab_test_util.h"

namespace scalelab::lab {
namespace {

using ::testing::HasSubstr;

TrialRow trial(std::int64_t id, int ranks, const std::string& status, double tokens_per_s, int repeat = 0) {
  TrialRow t;
  t.trial_id = id;
  t.repeat = repeat;
  t.status = parse_status(status).value();
  t.config = {{"params", {{"ranks", ranks}, {"launcher", "mpirun"}, {"model", "llama-tiny"}}}, {"workload", "native"}};
  if (status == "ok") {
    t.metrics = {{"tokens_per_s", tokens_per_s}, {"tokens_per_s_per_device", tokens_per_s / ranks}};
    t.record = {{"status", "ok"}, {"step_time_s", 0.5}, {"tokens_per_s", tokens_per_s}};
    if (ranks > 1) {
      t.record["comm_time_s"] = 0.1;
      t.record["comm_hidden_fraction"] = 0.75;
    }
  } else {
    t.reason = "rank 3 failed: out of device memory";
  }
  return t;
}

const Json* row_with(const Table& t, int ranks) {
  for (const Json& r : t.rows)
    if (r["ranks"] == ranks) return &r;
  return nullptr;
}

TEST(ScaleTable, ReferenceFiguresFromTrials) {
  ScaleSpec spec;
  spec.ranks = {1, 2, 4};
  spec.repeats = 2;
  spec.price_per_device_hour = 3.0;
  spec.token_budget = 1e9;
  spec.threads_per_rank = 1;
  // 1 rank: 1000 tokens/s (two repeats averaged); 2 ranks: 1900; 4 ranks failed.
  const std::vector<TrialRow> rows = {trial(1, 1, "ok", 900, 0), trial(2, 1, "ok", 1100, 1), trial(3, 2, "ok", 1900),
                                      trial(4, 4, "error", 0), trial(5, 2, "ok", 5000, 2) /* beyond repeats */};
  const Table t = scale_table(rows, spec);
  ASSERT_EQ(t.rows.size(), 3u);
  const Json& one = *row_with(t, 1);
  EXPECT_EQ(one["runs"], 2);
  EXPECT_EQ(one["status"], "ok");
  EXPECT_DOUBLE_EQ(one["tokens_per_s"].get<double>(), 1000);
  EXPECT_DOUBLE_EQ(one["speedup"].get<double>(), 1.0);
  EXPECT_TRUE(one["karp_flatt"].is_null());
  const Json& two = *row_with(t, 2);
  EXPECT_EQ(two["runs"], 1);  // the repeat beyond --repeats is left out
  EXPECT_DOUBLE_EQ(two["tokens_per_s_per_device"].get<double>(), 950);
  EXPECT_DOUBLE_EQ(two["speedup"].get<double>(), 1.9);
  EXPECT_DOUBLE_EQ(two["efficiency_pct"].get<double>(), 95.0);
  EXPECT_DOUBLE_EQ(two["cost_efficiency"].get<double>(), 0.95);
  // (1/1.9 - 1/2) / (1 - 1/2)
  EXPECT_NEAR(two["karp_flatt"].get<double>(), (1 / 1.9 - 0.5) / 0.5, 1e-12);
  EXPECT_NEAR(two["cost_per_million_tokens"].get<double>(), 3.0 * 2 / (3600 * 1900.0) * 1e6, 1e-12);
  EXPECT_DOUBLE_EQ(two["comm_time_s"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(two["comm_hidden_pct"].get<double>(), 75.0);
  const Json& four = *row_with(t, 4);
  EXPECT_EQ(four["status"], "error");
  EXPECT_THAT(four["reason"].get<std::string>(), HasSubstr("rank 3 failed"));
  EXPECT_FALSE(four.contains("speedup"));

  std::string notes;
  for (const auto& n : t.notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("shortest time: 2 devices"));
  EXPECT_THAT(notes, HasSubstr("lowest cost: 1 device"));
  EXPECT_THAT(notes, HasSubstr("lowest energy: no energy figures"));
  EXPECT_THAT(notes, HasSubstr("one rank of 1 thread"));
  bool has_cost = false, has_energy = false;
  for (const auto& c : t.columns) {
    has_cost = has_cost || c.key == "cost_per_million_tokens";
    has_energy = has_energy || c.key == "j_per_token";
  }
  EXPECT_TRUE(has_cost);
  EXPECT_FALSE(has_energy);  // no telemetry in these records
  EXPECT_THAT(render(t, TableFormat::kMarkdown), HasSubstr("| efficiency % |"));
}

TEST(ScaleTable, EnergyFromTelemetryAndNoSuccess) {
  ScaleSpec spec;
  spec.ranks = {1, 2};
  std::vector<TrialRow> rows = {trial(1, 1, "ok", 1000), trial(2, 2, "ok", 2000)};
  rows[0].record["telemetry"] = {{"j_per_token", 0.5}};
  rows[1].record["telemetry"] = {{"j_per_token", 0.4}};
  const Table t = scale_table(rows, spec);
  EXPECT_DOUBLE_EQ((*row_with(t, 2))["j_per_token"].get<double>(), 0.4);
  std::string notes;
  for (const auto& n : t.notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("lowest energy: 2 devices"));

  const Table none = scale_table({trial(3, 1, "timeout", 0)}, spec);
  ASSERT_EQ(none.rows.size(), 1u);
  EXPECT_EQ(none.rows[0]["status"], "timeout");
  notes.clear();
  for (const auto& n : none.notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("2 ranks: not run yet"));
  EXPECT_THAT(notes, HasSubstr("No successful trial"));
}

TEST(ScaleSpec, RoundTripsAndRankLists) {
  ScaleSpec s;
  s.ranks = {1, 2, 8};
  s.repeats = 3;
  s.launcher = "slurm";
  s.price_per_device_hour = 2.5;
  s.token_budget = 5e8;
  s.params = {{"model", "llama-small"}, {"seq_len", 256}};
  s.threads_per_rank = 2;
  const ScaleSpec back = ScaleSpec::from_json(Json::parse(s.to_json().dump()));
  EXPECT_EQ(back.ranks, s.ranks);
  EXPECT_EQ(back.repeats, 3);
  EXPECT_EQ(back.launcher, "slurm");
  EXPECT_EQ(back.price_per_device_hour, 2.5);
  EXPECT_EQ(back.token_budget, 5e8);
  EXPECT_EQ(back.params, s.params);
  EXPECT_EQ(back.threads_per_rank, 2);

  EXPECT_EQ(parse_rank_list({4, 1, 2, 4}), (std::vector<int>{4, 1, 2}));
  EXPECT_THROW(parse_rank_list({}), InvalidInput);
  EXPECT_THROW(parse_rank_list({1, 0}), InvalidInput);

  const ParamMap p = scale_trial_params(s, 8);
  EXPECT_EQ(p.at("ranks"), 8);
  EXPECT_EQ(p.at("launcher"), "slurm");
  EXPECT_EQ(p.at("threads"), 2);
  EXPECT_EQ(train_params(p).count("ranks"), 0u);
  EXPECT_EQ(train_params(p).count("launcher"), 0u);
  EXPECT_EQ(train_params(p).count("threads"), 1u);
}

TrialContext context(const std::string& dir) {
  TrialContext c;
  c.sweep = "study";
  c.dir = dir;
  c.key = "abc-r0";
  c.log_path = dir + "/abc-r0.log";
  c.record_path = dir + "/abc-r0.json";
  return c;
}

TEST(Launchers, MpirunWrapsTheTrainCommand) {
  MpirunOptions o;
  o.mpirun = "/usr/bin/mpirun";
  o.cores = 2;
  o.threads_per_rank = 1;
  o.as_root = true;
  o.extra_args = {"--mca", "btl", "self,vader"};
  MpirunLauncher l(o);
  const ParamMap params{{"ranks", 2}, {"launcher", "mpirun"}, {"seq_len", 16}, {"threads", 1}};
  const Launch a = l.launch(Workload::native(), "/bin/scalelab", params, context("/tmp/x"));
  EXPECT_EQ(a.argv, (std::vector<std::string>{"/usr/bin/mpirun", "--allow-run-as-root", "--bind-to", "core", "--mca",
                                               "btl", "self,vader", "-np", "2", "/bin/scalelab", "train", "--seq-len",
                                               "16", "--threads", "1", "--json", "/tmp/x/abc-r0.json"}));
  // More ranks than cores: oversubscribed, unbound; several threads per rank: unbound.
  const Launch b = l.launch(Workload::native(), "/bin/scalelab", {{"ranks", 4}, {"threads", 1}}, context("/tmp/x"));
  EXPECT_THAT(b.display, HasSubstr("--oversubscribe --bind-to none"));
  const Launch c = l.launch(Workload::native(), "/bin/scalelab", {{"ranks", 1}, {"threads", 2}}, context("/tmp/x"));
  EXPECT_THAT(c.display, HasSubstr("--bind-to none --mca btl self,vader -np 1"));
  EXPECT_THROW(l.launch(Workload::native(), "/bin/scalelab", {{"seq_len", 16}}, context("/tmp/x")), InvalidInput);
  EXPECT_THROW(l.launch(Workload::external("echo {x}", "test"), "/bin/scalelab", {{"ranks", 1}, {"x", 1}},
                        context("/tmp/x")),
               InvalidInput);
}

TEST(Launchers, SlurmJobShapeAndScript) {
  testing::TempDir dir;
  SlurmOptions o;
  o.gpus_per_node = 4;
  o.time = "00:10:00";
  o.partition = "gpu";
  SlurmLauncher l(o);
  const TrialContext ctx = context(dir.path());
  const SlurmJob j8 = l.job(Workload::native(), "/bin/scalelab", {{"ranks", 8}, {"seq_len", 16}}, ctx);
  EXPECT_EQ(j8.nodes, 2);
  EXPECT_EQ(j8.tasks_per_node, 4);
  EXPECT_EQ(j8.gpus_per_node, 4);
  EXPECT_EQ(j8.result_flag, "");
  EXPECT_EQ(j8.command, (std::vector<std::string>{"/bin/scalelab", "train", "--seq-len", "16", "--json", ctx.record_path}));
  const SlurmJob j2 = l.job(Workload::native(), "/bin/scalelab", {{"ranks", 2}}, ctx);
  EXPECT_EQ(j2.nodes, 1);
  EXPECT_EQ(j2.tasks_per_node, 2);
  EXPECT_EQ(j2.gpus_per_node, 2);
  EXPECT_THROW(l.job(Workload::native(), "/bin/scalelab", {{"ranks", 6}}, ctx), InvalidInput);

  const Launch launch = l.launch(Workload::native(), "/bin/scalelab", {{"ranks", 8}}, ctx);
  ASSERT_EQ(launch.argv.size(), 4u);
  EXPECT_EQ(launch.argv[0], "sbatch");
  EXPECT_EQ(launch.argv[1], "--parsable");
  EXPECT_EQ(launch.argv[2], "--wait");
  const std::string script = testing::read_text(launch.argv[3]);
  EXPECT_THAT(script, HasSubstr("#SBATCH --nodes=2\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --partition=gpu\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --time=00:10:00\n"));
  EXPECT_THAT(script, HasSubstr("srun --mpi=pmix --kill-on-bad-exit=1 '/bin/scalelab' 'train' '--json' '" +
                                ctx.record_path + "'\n"));
}

}  // namespace
}  // namespace scalelab::lab
