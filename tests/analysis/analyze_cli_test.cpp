// `scalelab analyze` end to end, and its answers to bad input: exit 2 with a message naming the
// file or flag, or an analysis that says what it could not compute and why.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../cli/cli_run.h"
#include "golden_util.h"
#include "lab/scale.h"
#include "analysis/frame.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
using cli_test::run;
using Json = nlohmann::json;

class AnalyzeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("scalelab-analyze-cli-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::string out(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(AnalyzeCli, SweepWritesJsonCsvsAndMarkdown) {
  const std::string db = out("golden.db");
  analysis::testing::build_golden_db(db, analysis::testing::read_json_file(analysis::testing::golden_dir() + "/sweep.json"));
  auto r = run("analyze --db " + db + " --sweep golden --target val_loss -o " + out("a"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("# Analysis of sweep golden"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("## OLS: val_loss"), std::string::npos);
  EXPECT_NE(r.output.find("constant columns dropped: max_steps"), std::string::npos);
  for (const char* f : {"analysis.json", "table.csv", "descriptive.csv", "correlation.csv", "pairs.csv", "ols.csv", "fits.csv", "groups.csv"})
    EXPECT_TRUE(fs::exists(out("a") + "/" + f)) << f;
  auto j = cli_test::read_json(out("a") + "/analysis.json");
  EXPECT_EQ(j["options"]["targets"][0], "val_loss");
  // The pairs CSV has every pair (header + one line each).
  std::ifstream pairs(out("a") + "/pairs.csv");
  std::size_t lines = 0;
  for (std::string l; std::getline(pairs, l);) ++lines;
  EXPECT_EQ(lines, j["pairs"]["count"].get<std::size_t>() + 1);
}

TEST_F(AnalyzeCli, MissingTargetIsExit2ListingTheColumns) {
  auto csv = file("runs.csv", "a,b,y\n1,2,3\n2,3,5\n3,5,4\n4,4,8\n");
  auto r = run("analyze --csv " + csv + " --target val_loss -o " + out("o"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--target 'val_loss' is not a column"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("columns: a, b, y"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out("o") + "/analysis.json"));
}

TEST_F(AnalyzeCli, RaggedCsvIsExit2NamingTheLine) {
  auto csv = file("ragged.csv", "a,b,y\n1,2,3\n2,3\n");
  auto r = run("analyze --csv " + csv + " --target y -o " + out("o"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("line 3 has 2 cells, the header has 3"), std::string::npos) << r.output;
}

TEST_F(AnalyzeCli, MissingFileAndNoSourceAreExit2) {
  auto r = run("analyze --csv " + out("nope.csv") + " --target y");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("cannot read the CSV file"), std::string::npos) << r.output;
  r = run("analyze --target y --csv x.csv --sweep s");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("not both"), std::string::npos) << r.output;
  r = run("analyze --db " + out("none.db") + " --sweep x");
  EXPECT_EQ(r.code, 2) << r.output;
}

TEST_F(AnalyzeCli, ConstantColumnsAndNanCellsAreReported) {
  // c is constant, y has NaN cells: c is dropped and listed, y's missing count is 2.
  auto csv = file("nan.csv", "a,c,y\n1,7,3\n2,7,nan\n3,7,4\n4,7,\n5,7,9\n6,7,8\n");
  auto r = run("analyze --csv " + csv + " --target y --format json -o " + out("o"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = cli_test::read_json(out("o") + "/analysis.json");
  EXPECT_EQ(j["table"]["dropped_constant"], Json::array({"c"}));
  for (const auto& d : j["descriptive"])
    if (d["column"] == "y") {
      EXPECT_EQ(d["all"]["missing"], 2);
    }
  EXPECT_EQ(j["ols"][0]["n"], 4);
  // A constant target: the analysis says it could not fit it, and why.
  r = run("analyze --csv " + csv + " --target c -o " + out("o2"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("target 'c' is constant"), std::string::npos) << r.output;
}

TEST_F(AnalyzeCli, OneRowSaysWhatItCannotCompute) {
  auto csv = file("one.csv", "a,y\n1,3\n");
  auto r = run("analyze --csv " + csv + " --target a -o " + out("o"));
  // Every column of a one-row table is constant: nothing to model, and the output says so.
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("only 1 row(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is constant"), std::string::npos) << r.output;
}

TEST_F(AnalyzeCli, AliasedColumnsAreNamed) {
  // b = 2a exactly: aliased with a and left out of the regression, by name.
  auto csv = file("alias.csv", "a,b,x,y\n1,2,5,3.1\n2,4,3,4.9\n3,6,4,7.2\n4,8,1,8.8\n5,10,2,11.1\n6,12,6,13.2\n");
  auto r = run("analyze --csv " + csv + " --target y --format json -o " + out("o"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = cli_test::read_json(out("o") + "/analysis.json");
  EXPECT_EQ(j["ols"][0]["aliased"], Json::array({"b"}));
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// A `scalelab scale` study: analyze adds the study's own table (speedup, cost per 1M tokens with
// the stored price, recommendations) as scale.csv and "scale_study".
TEST_F(AnalyzeCli, ScaleStudyTableIsIncluded) {
  const std::string db = out("scale.db");
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadWrite);
    lab::ScaleSpec spec;
    spec.ranks = {1, 2, 4};
    spec.price_per_device_hour = 2.5;
    spec.params = {{"model", "llama-small"}, {"micro_batch_size", 4}};
    auto id = store.ensure_sweep("study", lab::kScaleKind, spec.to_json());
    for (int n : spec.ranks) {
      lab::TrialRecord r;
      lab::ParamMap p = lab::scale_trial_params(spec, n);
      r.config = {{"workload", {{"kind", "native"}}}, {"params", Json(p)}};
      r.config_hash = lab::fnv1a_hex(Json(p).dump());
      r.status = lab::TrialStatus::kOk;
      r.metrics = {{"tokens_per_s", 1000.0 * n * (n == 1 ? 1.0 : 0.9)}, {"tokens_per_s_per_device", 1000.0 * (n == 1 ? 1.0 : 0.9)}};
      r.started_at = r.ended_at = "2026-01-01T00:00:00.000Z";
      store.insert_trial(id, r);
    }
  }
  auto r = run("analyze --db " + db + " --sweep study -o " + out("a"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("## Scaling study"), std::string::npos) << r.output;
  auto j = cli_test::read_json(out("a") + "/analysis.json");
  ASSERT_TRUE(j.contains("scale_study"));
  EXPECT_EQ(j["scale_study"]["rows"].size(), 3u);
  EXPECT_TRUE(fs::exists(out("a") + "/scale.csv"));
  EXPECT_EQ(j["scaling"]["rows"].size(), 3u);
  // The scaling curves take the study's stored price when no --price-per-gpu-hour is given.
  ASSERT_TRUE(j.contains("scaling_curves"));
  EXPECT_EQ(j["scaling_curves"]["price_per_gpu_hour"].get<double>(), 2.5);
  EXPECT_NE(j["scaling_curves"]["price_source"].get<std::string>().find("scale study"), std::string::npos);
  for (const auto& row : j["scaling_curves"]["rows"])
    EXPECT_NEAR(row["cost_per_million_tokens"].get<double>(), 2.5 * row["devices"].get<double>() / (3600.0 * row["tokens_per_s"].get<double>()) * 1e6, 1e-12);
}

// The golden scaling sweep end to end: curves, summary and the stability/SHAP tables as CSV files,
// the Markdown sections, and bad values of the new flags (exit 2 naming the flag).
TEST_F(AnalyzeCli, ScalingCurvesCostEnergyAndStabilityFiles) {
  const std::string db = out("scaling.db");
  analysis::testing::build_golden_db(db, analysis::testing::read_json_file(analysis::testing::golden_dir() + "/scaling_sweep.json"));
  auto r = run("analyze --db " + db + " --sweep golden-scaling --target tokens_per_s_per_device --price-per-gpu-hour 2.5 --bootstrap 5 -o " + out("a"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("## Scaling curves"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Stability over 5 bootstrap resamples"), std::string::npos) << r.output;
  for (const char* f : {"scaling_curves.csv", "scaling_summary.csv", "shap_interactions.csv", "shap_dependence.csv", "importance_stability.csv",
                        "group_boxes.csv", "group_histograms.csv"})
    EXPECT_TRUE(fs::exists(out("a") + "/" + f)) << f;
  auto j = cli_test::read_json(out("a") + "/analysis.json");
  EXPECT_EQ(j["scaling_curves"]["rows"].size(), 48u);
  EXPECT_TRUE(j["scaling_curves"]["energy"].get<bool>());
  EXPECT_EQ(j["trees"][0]["stability"]["resamples"], 5);
  r = run("analyze --db " + db + " --sweep golden-scaling --price-per-gpu-hour -1 -o " + out("b"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--price-per-gpu-hour"), std::string::npos) << r.output;
  r = run("analyze --db " + db + " --sweep golden-scaling --bootstrap -3 -o " + out("b"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--bootstrap"), std::string::npos) << r.output;
}

// A target whose every cell is missing (NaN metrics) is named as such, not as "constant"; a CSV
// whose every column is constant analyses nothing and says so.
TEST_F(AnalyzeCli, AllMissingTargetAndAllConstantColumnsAreReported) {
  auto csv = file("nan.csv", "a,b,y\n1,2,nan\n2,3,NaN\n3,5,\n4,4,NA\n");
  auto r = run("analyze --csv " + csv + " --target y -o " + out("a"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("target 'y' has no value in any of the 4 rows"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(no value at all: y)"), std::string::npos) << r.output;
  auto j = cli_test::read_json(out("a") + "/analysis.json");
  EXPECT_EQ(j["table"]["dropped_missing"], Json({"y"}));
  csv = file("const.csv", "a,b,y\n1,2,3\n1,2,3\n1,2,3\n");
  r = run("analyze --csv " + csv + " --target y -o " + out("b"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("constant columns dropped: a, b, y"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("target 'y' is constant over the 3 rows"), std::string::npos) << r.output;
}

// A sweep with one trial: the new sections say what they could not compute instead of failing.
TEST_F(AnalyzeCli, OneTrialSweepReportsWhatItCannotCompute) {
  const std::string db = out("one.db");
  Json sweep = analysis::testing::read_json_file(analysis::testing::golden_dir() + "/scaling_sweep.json");
  sweep["trials"] = Json::array({sweep["trials"][0]});
  analysis::testing::build_golden_db(db, sweep);
  auto r = run("analyze --db " + db + " --sweep golden-scaling --target tokens_per_s -o " + out("a"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("only 1 row(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("target 'tokens_per_s' is constant over the 1 rows"), std::string::npos) << r.output;
  auto j = cli_test::read_json(out("a") + "/analysis.json");
  EXPECT_FALSE(j.contains("scaling_curves"));  // one device count: no speedup to draw
}

}  // namespace
}  // namespace scalelab

namespace scalelab {
namespace {

// Column names are sanitized without losing characters from either end, and collisions get a
// suffix.
TEST(ColumnNames, SanitizedWithoutLoss) {
  EXPECT_EQ(analysis::sanitize_name("lr (x1e-3)"), "lr__x1e-3_");
  EXPECT_EQ(analysis::sanitize_name("__loss/val__"), "__loss_val__");
  EXPECT_EQ(analysis::sanitize_name("tel.nvml.power_w.p95"), "tel.nvml.power_w.p95");
  EXPECT_EQ(analysis::sanitize_name("attn=flash"), "attn=flash");
  const auto dir = std::filesystem::temp_directory_path() / ("scalelab-names-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string p = (dir / "n.csv").string();
  std::ofstream(p) << "a b,a_b,\"x,y\"\n1,2,3\n2,1,5\n3,3,4\n";
  auto f = analysis::build_frame_from_csv(p);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(f.columns.size(), 3u);
  EXPECT_EQ(f.columns[0].name, "a_b");
  EXPECT_EQ(f.columns[1].name, "a_b_2");
  EXPECT_EQ(f.columns[2].name, "x_y");
  EXPECT_EQ(f.columns[2].source, "x,y");
}

}  // namespace
}  // namespace scalelab
