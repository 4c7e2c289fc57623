// The cards of the #2 / #6 / #12 numbers (report/charts_stats.h) from analyses of the committed
// golden sweeps: which charts exist and how many items each named mark must draw (the browser
// test, report_browser_test.cpp, checks every chart's counts in Chromium for the golden sweep).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "../analysis/golden_util.h"
#include "analysis/analyze.h"
#include "analysis/frame.h"
#include "analysis/scaling_curves.h"
#include "lab/store.h"
#include "report/charts.h"

namespace scalelab {
namespace {

namespace fs = std::filesystem;
using analysis::testing::Json;

std::map<std::string, report::Chart> charts_of(const std::string& sweep_file, const std::string& sweep, const std::vector<std::string>& targets,
                                               std::optional<double> price, Json* analysis_out = nullptr) {
  const fs::path dir = fs::temp_directory_path() / ("scalelab-charts-stats-" + std::to_string(::getpid()) + "-" + sweep);
  fs::create_directories(dir);
  const std::string db = (dir / "s.db").string();
  analysis::testing::build_golden_db(db, analysis::testing::read_json_file(analysis::testing::golden_dir() + "/" + sweep_file));
  Json a;
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    auto frame = analysis::build_frame_from_sweep(store, sweep);
    analysis::AnalyzeOptions opt;
    opt.targets = targets;
    opt.bootstrap = 5;
    auto an = analysis::analyze(frame, opt);
    analysis::add_scaling_curves(an, frame, store, sweep, price);
    a = an.json;
  }
  fs::remove_all(dir);
  if (analysis_out) *analysis_out = a;
  std::map<std::string, report::Chart> out;
  for (auto& c : report::build_charts(a)) out[c.id] = c;
  return out;
}

TEST(StatsCharts, ScalingCurvesPerModelAndAxis) {
  auto charts = charts_of("scaling_sweep.json", "golden-scaling", {"tokens_per_s_per_device"}, 2.5);
  // One card per x axis (a panel per model, a line per device count): the speedup/efficiency
  // curves of scaling_facets.cpp; the per-model cards of the same curves are gone.
  for (const char* x : {"micro_batch_size", "seq_len"})
    for (const char* m : {"llama-small", "opt-small"}) EXPECT_FALSE(charts.count(std::string("scaling-eff-") + x + "-" + m));
  for (const char* id : {"scaling-vs-batch", "scaling-vs-seq"}) {
    ASSERT_TRUE(charts.count(id)) << id;
    const report::Chart& c = charts[id];
    EXPECT_EQ(c.expect_marks.at("sf_points"), 48) << id;  // 2 models x 3 micro-batches x 2 lengths x 4 device counts
    EXPECT_EQ(c.expect_marks.at("sf_facet"), 2) << id;
    EXPECT_EQ(c.expect_marks.at("sf_ideal_rule"), 8) << id;  // 4 device counts x 2 models
    EXPECT_TRUE(c.linked) << id << ": the filter and the brush reach it";
    // The toggle offers every figure the analysis has for these rows (the price gives a cost,
    // the golden telemetry an energy).
    const Json& sig = c.spec["signals"][0];
    EXPECT_EQ(sig["name"], "metric");
    EXPECT_EQ(sig["bind"]["options"], Json({"speedup", "efficiency_pct", "karp_flatt", "cost", "jpt"})) << id;
    EXPECT_NE(c.finding.find("At 8 devices the efficiency is"), std::string::npos) << c.finding;
    // Each point carries the analysis' numbers (no figure made in the page).
    const Json& rows = c.spec["data"][0]["values"];
    ASSERT_EQ(rows.size(), 48u);
    for (const auto& r : rows) {
      if (r["speedup"].is_number() && r["efficiency_pct"].get<double>() > 0) {
        EXPECT_NEAR(r["ideal_speedup"].get<double>(), r["ranks"].get<double>(), 1e-9) << "ideal speedup n/b with b = 1";
      }
    }
  }
  ASSERT_TRUE(charts.count("scaling-cost-energy"));
  EXPECT_EQ(charts["scaling-cost-energy"].expect_marks["points"], 8);  // 2 models x 4 device counts
  EXPECT_NE(charts["scaling-cost-energy"].finding.find("Price 2.5 per GPU-hour"), std::string::npos) << charts["scaling-cost-energy"].finding;
}

TEST(StatsCharts, ShapStabilityDependenceAndGroupedHistograms) {
  auto charts = charts_of("sweep.json", "golden", {"val_loss"}, std::nullopt);
  const Json e = analysis::testing::read_json_file(analysis::testing::golden_dir() + "/expected.json");
  const long p = static_cast<long>(e["trees"][0]["interaction_mean_abs"].size());
  for (const char* m : {"random_forest", "gradient_boosting"}) {
    const std::string t = std::string(m) + "-val_loss";
    ASSERT_TRUE(charts.count("shap-interactions-" + t)) << t;
    EXPECT_EQ(charts["shap-interactions-" + t].expect_marks["cells"], p * p);
    ASSERT_TRUE(charts.count("stability-" + t)) << t;
    EXPECT_EQ(charts["stability-" + t].expect_marks["bars"], p);
    EXPECT_EQ(charts["stability-" + t].expect_marks["intervals"], p);
    ASSERT_TRUE(charts.count("shap-dependence-" + t)) << t;
    EXPECT_GT(charts["shap-dependence-" + t].expect_marks["points"], 0);
  }
  // attn has 3 levels: 3 x 20 bars on the common edges.
  ASSERT_TRUE(charts.count("group-hist-attn-val_loss"));
  EXPECT_EQ(charts["group-hist-attn-val_loss"].expect_marks["bars"], 60);
  EXPECT_FALSE(charts.count("scaling-vs-batch"));  // no ranks: no scaling curves
}

// Importances per objective: with two targets, each feature's importance for each of them side by
// side on one scale (100 = each objective's top feature), the numbers of analysis.json's trees.
TEST(StatsCharts, ImportancesPerObjective) {
  Json a;
  auto charts = charts_of("sweep.json", "golden", {"val_loss", "tokens_per_s_per_device"}, std::nullopt, &a);
  ASSERT_TRUE(charts.count("importance-objectives"));
  const report::Chart& c = charts["importance-objectives"];
  EXPECT_EQ(c.section, charts["pareto"].section) << "next to the Pareto front";
  std::map<std::string, std::map<std::string, double>> shap;  // target -> feature -> % of the top
  long gb_bars = 0;
  for (const auto& r : a["trees"]) {
    if (r["model"] != "gradient_boosting" || r.contains("error")) continue;
    double top = 0;
    for (const auto& v : r["shap_mean_abs"]) top = std::max(top, v.get<double>());
    for (std::size_t k = 0; k < r["features"].size(); ++k)
      shap[r["target"].get<std::string>()][r["features"][k].get<std::string>()] = 100 * r["shap_mean_abs"][k].get<double>() / top;
    gb_bars += static_cast<long>(r["features"].size());
  }
  ASSERT_EQ(shap.size(), 2u);
  EXPECT_EQ(c.expect_marks.at("bars"), gb_bars);  // the default model: gradient boosting
  EXPECT_EQ(c.spec["signals"][0]["value"], "shap");
  long checked = 0;
  for (const auto& row : c.spec["data"][0]["values"]) {
    if (row["model"] != "gradient_boosting") continue;
    EXPECT_NEAR(row["shap"].get<double>(), shap[row["target"].get<std::string>()][row["feature"].get<std::string>()], 1e-9);
    ++checked;
  }
  EXPECT_EQ(checked, gb_bars);
  // The finding names each objective's top feature.
  for (const auto& [target, by] : shap) {
    std::string best;
    for (const auto& [f, v] : by)
      if (best.empty() || v > by.at(best)) best = f;
    EXPECT_NE(c.finding.find(best + " drives " + target), std::string::npos) << c.finding;
  }
  // One target: no card.
  EXPECT_FALSE(charts_of("sweep.json", "golden", {"val_loss"}, std::nullopt).count("importance-objectives"));
}

// Box plots: Tukey's whiskers (1.5 IQR) from the analysis, not min–max, and a point per outlier.
TEST(StatsCharts, BoxWhiskersAreTukeys) {
  Json a;
  auto charts = charts_of("sweep.json", "golden", {"val_loss"}, std::nullopt, &a);
  Json* g = nullptr;
  for (auto& x : a["groups"])
    if (x["group"] == "attn" && x["value"] == "val_loss") g = &x;
  ASSERT_NE(g, nullptr);
  auto count_outliers = [](const Json& grp) {
    long n = 0;
    for (const auto& b : grp["box"]) n += static_cast<long>(b["outliers"].size());
    return n;
  };
  const report::Chart& c = charts["group-attn-val_loss"];
  const long levels = static_cast<long>((*g)["levels"].size());
  EXPECT_EQ(c.expect_marks.at("whiskers"), levels);
  EXPECT_EQ(c.expect_marks.at("outliers"), count_outliers(*g));
  for (std::size_t k = 0; k < (*g)["box"].size(); ++k) {
    EXPECT_EQ(c.spec["data"][0]["values"][k]["wl"], (*g)["box"][k]["whisker_low"]);
    EXPECT_EQ(c.spec["data"][0]["values"][k]["wh"], (*g)["box"][k]["whisker_high"]);
  }
  // A level with two values beyond its whiskers: two outlier points, the whisker inside them.
  Json& b0 = (*g)["box"][0];
  b0["outliers"] = Json::array({b0["min"], b0["max"]});
  b0["whisker_low"] = b0["q25"];
  b0["whisker_high"] = b0["q75"];
  auto again = report::build_charts(a);
  const auto it = std::find_if(again.begin(), again.end(), [](const report::Chart& x) { return x.id == "group-attn-val_loss"; });
  ASSERT_NE(it, again.end());
  EXPECT_EQ(it->expect_marks.at("outliers"), count_outliers(*g));
  EXPECT_GE(it->expect_marks.at("outliers"), 2);
  EXPECT_EQ(it->spec["data"][1]["values"][0]["v"], b0["min"]);
  EXPECT_EQ(it->spec["data"][0]["values"][0]["wl"], b0["q25"]);
  EXPECT_NE(it->finding.find("Tukey"), std::string::npos);
}

}  // namespace
}  // namespace scalelab
