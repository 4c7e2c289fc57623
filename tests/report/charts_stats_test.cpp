// The cards of the #2 / #6 / #12 numbers (report/charts_stats.h) from analyses of the committed
// golden sweeps: which charts exist and how many items each named mark must draw (the browser
// test, report_browser_test.cpp, checks every chart's counts in Chromium for the golden sweep).
#include <gtest/gtest.h>

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
                                               std::optional<double> price) {
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
  std::map<std::string, report::Chart> out;
  for (auto& c : report::build_charts(a)) out[c.id] = c;
  return out;
}

TEST(StatsCharts, ScalingCurvesPerModelAndAxis) {
  auto charts = charts_of("scaling_sweep.json", "golden-scaling", {"tokens_per_s_per_device"}, 2.5);
  for (const char* x : {"micro_batch_size", "seq_len"})
    for (const char* m : {"llama-small", "opt-small"}) {
      const std::string id = std::string("scaling-eff-") + x + "-" + m;
      ASSERT_TRUE(charts.count(id)) << id;
      EXPECT_EQ(charts[id].expect_marks["points"], 24) << id;  // 3 micro-batches x 2 lengths x 4 device counts
      EXPECT_NE(charts[id].finding.find("Lowest efficiency"), std::string::npos) << charts[id].finding;
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
  EXPECT_FALSE(charts.count("scaling-eff-micro_batch_size-all"));  // no ranks: no scaling curves
}

}  // namespace
}  // namespace scalelab
