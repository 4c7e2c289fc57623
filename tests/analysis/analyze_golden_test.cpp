// The analysis against the reference packages (tests/golden/analysis/make_golden.py: numpy,
// scipy, pandas, statsmodels, scikit-learn) on the committed synthetic sweep.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "analysis/analyze.h"
#include "analysis/frame.h"
#include "analysis/agreement.h"
#include "analysis/telemetry.h"
#include "golden_util.h"
#include "lab/store.h"

namespace scalelab::analysis {
namespace {

using namespace testing;
namespace fs = std::filesystem;

class GoldenAnalysis : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    expected_ = new Json(read_json_file(golden_dir() + "/expected.json"));
    dir_ = new fs::path(fs::temp_directory_path() / ("scalelab-analysis-golden-" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    const std::string db = (*dir_ / "golden.db").string();
    build_golden_db(db, read_json_file(golden_dir() + "/sweep.json"));
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    frame_ = new Frame(build_frame_from_sweep(store, "golden"));
    AnalyzeOptions opt;
    opt.targets = {"val_loss", "tokens_per_s_per_device"};
    opt.split = 0.75;
    opt.seed = 0;
    opt.cv = 5;
    opt.bootstrap = 20;  // as make_golden.py's BOOTSTRAP
    result_ = new Json(analyze(*frame_, opt).json);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete expected_;
    delete dir_;
    delete frame_;
    delete result_;
  }
  static const Json& E() { return *expected_; }
  static const Json& R() { return *result_; }
  static Json* expected_;
  static Json* result_;
  static fs::path* dir_;
  static Frame* frame_;
};
Json* GoldenAnalysis::expected_ = nullptr;
Json* GoldenAnalysis::result_ = nullptr;
fs::path* GoldenAnalysis::dir_ = nullptr;
Frame* GoldenAnalysis::frame_ = nullptr;

TEST_F(GoldenAnalysis, FrameMatchesTheReference) {
  const Json& ef = E()["frame"];
  ASSERT_EQ(frame_->rows(), ef["rows"].get<std::size_t>());
  EXPECT_EQ(frame_->dropped_constant, ef["dropped_constant"].get<std::vector<std::string>>());
  EXPECT_EQ(frame_->repeats, ef["repeats"].get<std::vector<int>>());
  ASSERT_EQ(frame_->columns.size(), ef["columns"].size());
  for (std::size_t k = 0; k < frame_->columns.size(); ++k) {
    const Column& c = frame_->columns[k];
    const Json& e = ef["columns"][k];
    ASSERT_EQ(c.name, e["name"].get<std::string>());
    EXPECT_EQ(kind_name(c.kind), e["kind"].get<std::string>()) << c.name;
    EXPECT_EQ(role_name(c.role), e["role"].get<std::string>()) << c.name;
    EXPECT_EQ(c.log2_axis, e["log2_axis"].get<bool>()) << c.name;
    if (c.kind == ColumnKind::kNumeric) {
      for (std::size_t i = 0; i < frame_->rows(); ++i) expect_close(c.values[i], e["values"][i], c.name + " row " + std::to_string(i));
    } else {
      EXPECT_EQ(c.levels, e["levels"].get<std::vector<std::string>>()) << c.name;
      for (std::size_t i = 0; i < frame_->rows(); ++i) EXPECT_EQ(c.text[i], e["values"][i].get<std::string>()) << c.name;
    }
  }
  // The OOM trial is left out, and said so.
  ASSERT_FALSE(frame_->notes.empty());
  EXPECT_NE(frame_->notes[0].find("1 trial"), std::string::npos);
}

TEST_F(GoldenAnalysis, DescriptiveStatistics) {
  std::size_t checked = 0;
  for (const auto& d : R()["descriptive"]) {
    const std::string name = d["column"];
    ASSERT_TRUE(E()["descriptive"].contains(name)) << name;
    for (const char* sub : {"all", "train", "test"}) {
      const Json& e = E()["descriptive"][name][sub];
      const Json& g = d[sub];
      EXPECT_EQ(g["n"], e["n"]) << name << " " << sub;
      EXPECT_EQ(g["missing"].get<int>(), e["missing"].get<int>()) << name << " " << sub;
      for (const char* k : {"mean", "std0", "std1", "min", "q25", "median", "q75", "max", "skew_g1", "kurt_g2", "skew_G1", "kurt_G2"})
        if (e.contains(k)) expect_close(g[k], e[k], name + " " + sub + " " + k, 1e-9);
      ++checked;
    }
  }
  EXPECT_EQ(checked, E()["descriptive"].size() * 3);
}

TEST_F(GoldenAnalysis, CorrelationMatrix) {
  const Json& e = E()["correlation"];
  const Json& g = R()["correlation"];
  ASSERT_EQ(g["variables"], e["variables"]);
  const std::size_t k = e["variables"].size();
  for (std::size_t i = 0; i < k; ++i)
    for (std::size_t j = 0; j < k; ++j) {
      const std::string w = e["variables"][i].get<std::string>() + " x " + e["variables"][j].get<std::string>();
      expect_close(g["pearson_r"][i][j], e["pearson_r"][i][j], "r " + w);
      expect_close(g["spearman_rho"][i][j], e["spearman_rho"][i][j], "rho " + w);
      if (i != j) {
        expect_p(g["pearson_p"][i][j], e["pearson_p"][i][j], "p " + w);
        expect_p(g["spearman_p"][i][j], e["spearman_p"][i][j], "p(rho) " + w);
      }
    }
  // The clustered order is a permutation.
  auto order = g["clustered_order"].get<std::vector<std::size_t>>();
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < k; ++i) EXPECT_EQ(order[i], i);
}

TEST_F(GoldenAnalysis, RankedPairsWithBenjaminiHochberg) {
  std::map<std::string, Json> want;
  for (const auto& p : E()["pairs"]) want[p["a"].get<std::string>() + "|" + p["b"].get<std::string>()] = p;
  const Json& got = R()["pairs"]["rows"];
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(R()["pairs"]["count"].get<std::size_t>(), want.size());
  double last = 2;
  for (const auto& g : got) {
    const std::string key = g["a"].get<std::string>() + "|" + g["b"].get<std::string>();
    ASSERT_TRUE(want.count(key)) << key;
    const Json& e = want[key];
    EXPECT_EQ(g["kind"], e["kind"]) << key;
    EXPECT_EQ(g["n"], e["n"]) << key;
    expect_close(g["effect"], e["effect"], key + " effect");
    expect_p(g["p"], e["p"], key + " p");
    expect_p(g["q"], e["q"], key + " q");
    for (const char* k : {"r", "rho", "eta2", "f1", "auc", "cramers_v", "chi2"})
      if (e.contains(k)) expect_close(g[k], e[k], key + " " + k);
    EXPECT_LE(g["effect"].get<double>(), last) << "ranked by effect";
    last = g["effect"].get<double>();
  }
  // Levels of one categorical are never paired with each other.
  for (const auto& g : got) {
    auto a = g["a"].get<std::string>(), b = g["b"].get<std::string>();
    EXPECT_FALSE(a.rfind("attn=", 0) == 0 && b.rfind("attn=", 0) == 0) << a << " " << b;
  }
}

TEST_F(GoldenAnalysis, OlsWithVifAndCrossValidation) {
  for (const auto& g : R()["ols"]) {
    const std::string t = g["target"];
    const Json& e = E()["ols"][t];
    ASSERT_FALSE(g.contains("error")) << g.dump();
    EXPECT_EQ(g["n"], e["n"]);
    EXPECT_EQ(g["p"], e["p"]);
    EXPECT_TRUE(g["aliased"].empty());
    expect_close(g["r2"], e["r2"], t + " R2");
    expect_close(g["adj_r2"], e["adj_r2"], t + " adj R2");
    expect_close(g["f"], e["f"], t + " F", 1e-9);
    expect_p(g["f_p"], e["f_p"], t + " F p");
    ASSERT_EQ(g["terms"].size(), e["terms"].size());
    for (std::size_t k = 0; k < e["terms"].size(); ++k) {
      const Json& gt = g["terms"][k];
      const Json& et = e["terms"][k];
      const std::string w = t + " " + et["name"].get<std::string>();
      EXPECT_EQ(gt["name"], et["name"]);
      for (const char* f : {"coef", "se", "t", "ci_low", "ci_high", "vif", "std_beta"})
        if (et.contains(f)) expect_close(gt[f], et[f], w + " " + f, 1e-9);
      expect_p(gt["p"], et["p"], w + " p");
    }
    ASSERT_TRUE(g.contains("cv"));
    expect_close(g["cv"]["r2"], e["cv"]["r2"], t + " cv R2", 1e-9);
    expect_close(g["cv"]["rmse"], e["cv"]["rmse"], t + " cv RMSE", 1e-9);
  }
}

TEST_F(GoldenAnalysis, PerParameterFits) {
  for (const auto& tf : R()["fits"]) {
    const std::string t = tf["target"];
    std::map<std::string, Json> want;
    for (const auto& f : E()["fits"][t]) want[f["x"]] = f;
    ASSERT_EQ(tf["fits"].size(), want.size());
    double last = 2;
    for (const auto& g : tf["fits"]) {
      const Json& e = want[g["x"]];
      const std::string w = t + " ~ " + g["x"].get<std::string>();
      EXPECT_EQ(g["n"], e["n"]);
      for (const char* f : {"slope", "intercept", "r", "r2", "slope_se", "intercept_se", "slope_ci_low", "slope_ci_high"})
        expect_close(g[f], e[f], w + " " + f, 1e-9);
      expect_p(g["p"], e["p"], w + " p");
      EXPECT_LE(std::fabs(g["r"].get<double>()), last) << "ordered by |r|";
      last = std::fabs(g["r"].get<double>());
    }
  }
}

TEST_F(GoldenAnalysis, HistogramsAndEcdf) {
  std::size_t n = 0;
  for (const auto& d : R()["distributions"]) {
    const std::string c = d["column"];
    const Json& e = E()["distributions"][c];
    EXPECT_EQ(d["histogram"]["counts"], e["counts"]) << c;
    for (std::size_t k = 0; k < e["edges"].size(); ++k) expect_close(d["histogram"]["edges"][k], e["edges"][k], c + " edge");
    ASSERT_EQ(d["ecdf"]["x"].size(), e["ecdf_x"].size()) << c;
    for (std::size_t k = 0; k < e["ecdf_x"].size(); ++k) {
      expect_close(d["ecdf"]["x"][k], e["ecdf_x"][k], c + " ecdf x");
      expect_close(d["ecdf"]["f"][k], e["ecdf_f"][k], c + " ecdf f");
    }
    ++n;
  }
  EXPECT_EQ(n, E()["distributions"].size());
}

TEST_F(GoldenAnalysis, ParetoFront) {
  const Json& p = R()["pareto"];
  EXPECT_EQ(p["x"], "tokens_per_s_per_device");
  EXPECT_EQ(p["y"], "val_loss");
  ASSERT_EQ(p["rows"].size(), E()["pareto_front"].size());
  std::size_t on = 0;
  for (std::size_t k = 0; k < p["rows"].size(); ++k) {
    EXPECT_EQ(p["rows"][k]["front"], E()["pareto_front"][k]) << k;
    on += p["rows"][k]["front"].get<bool>();
  }
  EXPECT_EQ(p["on_front"].get<std::size_t>(), on);
  EXPECT_GE(on, 1u);
}

TEST_F(GoldenAnalysis, GroupTestsAnovaAndKruskal) {
  ASSERT_EQ(R()["groups"].size(), E()["groups"].size());
  for (std::size_t k = 0; k < E()["groups"].size(); ++k) {
    const Json& g = R()["groups"][k];
    const Json& e = E()["groups"][k];
    const std::string w = e["group"].get<std::string>() + " / " + e["value"].get<std::string>();
    EXPECT_EQ(g["group"], e["group"]);
    EXPECT_EQ(g["value"], e["value"]);
    EXPECT_EQ(g["n"], e["n"]);
    expect_close(g["eta2"], e["eta2"], w + " eta2");
    expect_close(g["f"], e["f"], w + " F", 1e-9);
    expect_p(g["f_p"], e["f_p"], w + " F p");
    expect_close(g["kruskal_h"], e["kruskal_h"], w + " H", 1e-9);
    expect_p(g["kruskal_p"], e["kruskal_p"], w + " H p");
    ASSERT_EQ(g["box"].size(), e["box"].size());
    for (std::size_t l = 0; l < e["box"].size(); ++l)
      for (const char* q : {"min", "q25", "median", "q75", "max"}) expect_close(g["box"][l][q], e["box"][l][q], w + " box " + q);
  }
}

// The same runs from a CSV (another tool's table): the regression and fits agree with the
// database path, and the constant column is listed.
TEST(CsvAnalysis, RunsCsvGivesTheSameRegression) {
  Frame f = build_frame_from_csv(golden_dir() + "/runs.csv");
  const Json e = read_json_file(golden_dir() + "/expected.json");
  EXPECT_EQ(f.rows(), e["frame"]["rows"].get<std::size_t>());
  EXPECT_NE(std::find(f.dropped_constant.begin(), f.dropped_constant.end(), "max_steps"), f.dropped_constant.end());
  AnalyzeOptions opt;
  opt.targets = {"val_loss"};
  opt.features = e["features"].get<std::vector<std::string>>();
  Json r = analyze(f, opt).json;
  const Json& eo = e["ols"]["val_loss"];
  ASSERT_EQ(r["ols"][0]["terms"].size(), eo["terms"].size());
  for (std::size_t k = 0; k < eo["terms"].size(); ++k) {
    expect_close(r["ols"][0]["terms"][k]["coef"], eo["terms"][k]["coef"], "coef", 1e-9);
    expect_p(r["ols"][0]["terms"][k]["p"], eo["terms"][k]["p"], "p");
  }
}

}  // namespace
}  // namespace scalelab::analysis

namespace scalelab::analysis {
namespace {

// Telemetry per trial x device and the imbalance table against numpy (device 1 is the planted
// straggler: ~61 % against ~92 %).
TEST(GoldenTelemetry, ImbalanceMatchesNumpy) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("scalelab-analysis-tel-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "golden.db").string();
  testing::build_golden_db(db, testing::read_json_file(testing::golden_dir() + "/sweep.json"));
  const Json e = testing::read_json_file(testing::golden_dir() + "/expected.json");
  lab::Table imb;
  Json t;
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    t = telemetry_section(store, "golden", imb);
  }
  fs::remove_all(dir);
  ASSERT_EQ(imb.rows.size(), e["imbalance"].size());
  std::size_t stragglers = 0;
  for (std::size_t k = 0; k < imb.rows.size(); ++k) {
    const Json& g = imb.rows[k];
    const Json& w = e["imbalance"][k];
    EXPECT_EQ(g["device"], w["device"]);
    testing::expect_close(g["mean_util_pct"], w["mean_util_pct"], "mean util");
    testing::expect_close(g["idle_fraction"], w["idle_fraction"], "idle");
    testing::expect_close(g["ratio_to_median"], w["ratio_to_median"], "ratio");
    EXPECT_EQ(g["idle"], w["idle"]);
    EXPECT_EQ(g["straggler"], w["straggler"]);
    stragglers += g["straggler"].get<bool>();
  }
  EXPECT_GT(stragglers, 0u);
  EXPECT_EQ(t["flagged"].size(), stragglers);
  // Every trial's series carry avg / max / p95 and the engine's counter sits 256 MiB below NVML's.
  const Json& tr = t["trials"][0];
  double nvml = 0, engine = 0;
  for (const auto& s : tr["series"]) {
    if (s["metric"] == "mem_used_bytes" && s["source"] == "nvml" && s["device"] == "0") nvml = s["avg"].get<double>();
    if (s["source"] == "engine") engine = s["avg"].get<double>();
  }
  EXPECT_NEAR(nvml - engine, 268435456.0, 1e-3);
}

}  // namespace
}  // namespace scalelab::analysis

namespace scalelab::analysis {
namespace {

// xgboost importances, cross-validated R² and permutation importances against python xgboost at
// Debian's libxgboost version, the same parameters (1e-6: the models predict in float32; a
// vector's values are compared relative to its largest magnitude).
TEST_F(GoldenAnalysis, XgboostImportancesMatchPythonXgboost) {
  const Json& want = E()["trees"];
  const Json& got = R()["trees"];
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(R()["xgboost_version"], E()["versions"]["xgboost"]);
  auto close_vec = [](const Json& g, const Json& w, const std::string& what) {
    ASSERT_EQ(g.size(), w.size()) << what;
    double scale = 0;
    for (const auto& v : w) scale = std::max(scale, std::fabs(v.get<double>()));
    for (std::size_t k = 0; k < w.size(); ++k)
      EXPECT_LE(std::fabs(g[k].get<double>() - w[k].get<double>()), 1e-6 * scale) << what << "[" << k << "]: " << g[k] << " vs " << w[k];
  };
  for (std::size_t m = 0; m < want.size(); ++m) {
    const Json& g = got[m];
    const Json& w = want[m];
    const std::string what = w["model"].get<std::string>() + " " + w["target"].get<std::string>();
    ASSERT_FALSE(g.contains("error")) << g.dump();
    EXPECT_EQ(g["model"], w["model"]);
    EXPECT_EQ(g["n"], w["n"]);
    EXPECT_NEAR(g["cv_r2"].get<double>(), w["cv_r2"].get<double>(), 1e-6) << what;
    EXPECT_NEAR(g["cv_rmse"].get<double>(), w["cv_rmse"].get<double>(), 1e-6 * w["cv_rmse"].get<double>()) << what;
    EXPECT_EQ(g["unreliable"].get<bool>(), w["cv_r2"].get<double>() < 0.5) << what;
    for (const char* k : {"gain", "weight", "cover", "permutation_mean", "permutation_sd", "shap_mean_abs"}) close_vec(g[k], w[k], what + " " + k);
    // SHAP additivity: contributions and bias sum to the prediction (float32 sums).
    double scale = 0;
    for (const auto& v : g["shap_mean_abs"]) scale = std::max(scale, v.get<double>());
    EXPECT_LE(g["shap_additivity_max_abs_error"].get<double>(), 1e-4 * std::max(scale, 1.0)) << what;
  }
}

// #12 SHAP interaction values (pred_interactions) against python xgboost: the mean |phi_jk|
// matrix (1e-6 of its largest entry), additivity of each row's interactions to its contributions,
// and the dependence data of the top features (indices, the interacting feature, the points).
TEST_F(GoldenAnalysis, ShapInteractionsAndDependenceMatchPythonXgboost) {
  const Json& want = E()["trees"];
  const Json& got = R()["trees"];
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t m = 0; m < want.size(); ++m) {
    const Json& g = got[m];
    const Json& w = want[m];
    const std::string what = w["model"].get<std::string>() + " " + w["target"].get<std::string>();
    const Json& wi = w["interaction_mean_abs"];
    const Json& gi = g["interaction_mean_abs"];
    ASSERT_EQ(gi.size(), wi.size()) << what;
    double scale = 0;
    for (const auto& row : wi)
      for (const auto& v : row) scale = std::max(scale, v.get<double>());
    ASSERT_GT(scale, 0) << what;
    for (std::size_t j = 0; j < wi.size(); ++j)
      for (std::size_t k = 0; k < wi.size(); ++k) {
        EXPECT_LE(std::fabs(gi[j][k].get<double>() - wi[j][k].get<double>()), 1e-6 * scale) << what << " [" << j << "][" << k << "]";
        // phi_jk and phi_kj are computed apart in float32: symmetric up to its rounding.
        EXPECT_LE(std::fabs(gi[j][k].get<double>() - gi[k][j].get<double>()), 1e-5 * scale) << what << ": the interaction matrix is symmetric";
      }
    // Each row of the interactions sums to the contribution (float32 sums of up to p + 1 terms).
    EXPECT_LE(g["interaction_additivity_max_abs_error"].get<double>(), 1e-5 * std::max(scale, 1.0)) << what;
    const Json& wd = w["dependence"];
    const Json& gd = g["dependence"];
    ASSERT_EQ(gd.size(), wd.size()) << what;
    for (std::size_t d = 0; d < wd.size(); ++d) {
      EXPECT_EQ(gd[d]["feature"], wd[d]["feature"]) << what << " dependence " << d;
      EXPECT_EQ(gd[d]["color_by"], wd[d]["color_by"]) << what << " dependence " << d;
      EXPECT_EQ(gd[d]["name"], g["features"][gd[d]["feature"].get<std::size_t>()]) << what;
      ASSERT_EQ(gd[d]["x"].size(), wd[d]["x"].size());
      double s2 = 0;
      for (const auto& v : wd[d]["shap"]) s2 = std::max(s2, std::fabs(v.get<double>()));
      for (std::size_t i = 0; i < wd[d]["x"].size(); ++i) {
        expect_close(gd[d]["x"][i], wd[d]["x"][i], what + " dependence x");
        EXPECT_LE(std::fabs(gd[d]["shap"][i].get<double>() - wd[d]["shap"][i].get<double>()), 1e-6 * s2) << what << " dependence shap " << i;
      }
    }
  }
}

// #12 importance stability over 20 bootstrap resamples against python xgboost refitted on the same
// resamples: per importance the mean, sd and 2.5/97.5 percentiles (1e-6 of the largest mean), the
// rank statistics and shares exactly (up to rounding), Spearman's rho with the all-rows model.
TEST_F(GoldenAnalysis, BootstrapStabilityMatchesPythonXgboost) {
  const Json& want = E()["trees"];
  const Json& got = R()["trees"];
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t m = 0; m < want.size(); ++m) {
    const Json& gs = got[m]["stability"];
    const Json& ws = want[m]["stability"];
    const std::string what = want[m]["model"].get<std::string>() + " " + want[m]["target"].get<std::string>();
    ASSERT_EQ(gs["resamples"], ws["resamples"]) << what;
    for (const char* kind : {"gain", "weight", "cover", "shap_mean_abs"}) {
      const Json& g = gs[kind];
      const Json& w = ws[kind];
      double scale = 0;
      for (const auto& v : w["mean"]) scale = std::max(scale, v.get<double>());
      for (const char* k : {"mean", "sd", "low", "high"})
        for (std::size_t f = 0; f < w[k].size(); ++f)
          EXPECT_LE(std::fabs(g[k][f].get<double>() - w[k][f].get<double>()), 1e-6 * scale) << what << " " << kind << " " << k << "[" << f << "]";
      for (const char* k : {"mean_rank", "rank_low", "rank_high", "top3_share"})
        for (std::size_t f = 0; f < w[k].size(); ++f)
          EXPECT_NEAR(g[k][f].get<double>(), w[k][f].get<double>(), 1e-9) << what << " " << kind << " " << k << "[" << f << "]";
      EXPECT_EQ(g["spearman_n"], w["spearman_n"]) << what << " " << kind;
      if (!w["spearman_mean"].is_null()) {
        EXPECT_NEAR(g["spearman_mean"].get<double>(), w["spearman_mean"].get<double>(), 1e-9) << what << " " << kind;
      }
      EXPECT_NEAR(g["top1_share"].get<double>(), w["top1_share"].get<double>(), 1e-12) << what << " " << kind;
    }
  }
}

// #6 grouped histograms: common edges from all the values (numpy.histogram), each level's counts
// on them, the ECDF per level, Tukey's whiskers and the outliers (numpy's linear quartiles).
TEST_F(GoldenAnalysis, GroupedHistogramsEcdfAndWhiskersMatchNumpy) {
  const Json& want = E()["groups"];
  const Json& got = R()["groups"];
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Json& w = want[i]["grouped"];
    const Json& g = got[i];
    const std::string what = g["group"].get<std::string>() + " / " + g["value"].get<std::string>();
    ASSERT_EQ(g["histogram"]["edges"].size(), w["edges"].size()) << what;
    for (std::size_t e = 0; e < w["edges"].size(); ++e) expect_close(g["histogram"]["edges"][e], w["edges"][e], what + " edge");
    ASSERT_EQ(g["histogram"]["levels"].size(), w["levels"].size()) << what;
    long total = 0;
    for (std::size_t l = 0; l < w["levels"].size(); ++l) {
      const Json& wl = w["levels"][l];
      const Json& gl = g["histogram"]["levels"][l];
      EXPECT_EQ(gl["level"], wl["level"]) << what;
      EXPECT_EQ(gl["counts"], wl["counts"]) << what << " " << wl["level"];
      for (long c : gl["counts"].get<std::vector<long>>()) total += c;
      ASSERT_EQ(gl["ecdf"]["x"].size(), wl["ecdf_x"].size()) << what;
      for (std::size_t k = 0; k < wl["ecdf_x"].size(); ++k) {
        expect_close(gl["ecdf"]["x"][k], wl["ecdf_x"][k], what + " ecdf x");
        expect_close(gl["ecdf"]["f"][k], wl["ecdf_f"][k], what + " ecdf f");
      }
      expect_close(g["box"][l]["whisker_low"], wl["whisker_low"], what + " whisker low");
      expect_close(g["box"][l]["whisker_high"], wl["whisker_high"], what + " whisker high");
      EXPECT_EQ(g["box"][l]["outliers"], wl["outliers"]) << what;
    }
    EXPECT_EQ(total, g["n"].get<long>()) << what << ": every value is in one bin";
  }
}

}  // namespace
}  // namespace scalelab::analysis

namespace scalelab::analysis {
namespace {

// Agreement of telemetry sources against numpy/scipy: the engine's reserved bytes sit 256 MiB
// below NVML's used bytes (the planted offset is the Bland–Altman bias), nvidia-smi's power is
// NVML's plus noise.
TEST(GoldenAgreement, BlandAltmanAndCccMatchNumpy) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("scalelab-analysis-agree-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "golden.db").string();
  testing::build_golden_db(db, testing::read_json_file(testing::golden_dir() + "/sweep.json"));
  const Json e = testing::read_json_file(testing::golden_dir() + "/expected.json");
  lab::Table table;
  Json got;
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    got = agreement_section(store, "golden", table);
  }
  fs::remove_all(dir);
  ASSERT_EQ(got.size(), e["agreement"].size());
  ASSERT_EQ(got.size(), 2u);
  for (std::size_t k = 0; k < got.size(); ++k) {
    const Json& g = got[k];
    const Json& w = e["agreement"][k];
    EXPECT_EQ(g["a"], w["a"]);
    EXPECT_EQ(g["b"], w["b"]);
    for (const char* level : {"per_sample", "per_trial"}) {
      EXPECT_EQ(g[level]["n"], w[level]["n"]);
      // The differences' scale is the limits' magnitude: an sd of 1e-7 bytes next to a bias of
      // 2^28 bytes is rounding, compared at that scale.
      const double scale = 1e-6 * std::max(std::fabs(w[level]["lower"].get<double>()), std::fabs(w[level]["upper"].get<double>()));
      for (const char* f : {"slope", "intercept", "r", "r2", "bias", "sd", "lower", "upper", "ccc"}) {
        const double gv = g[level][f].get<double>(), wv = w[level][f].get<double>();
        EXPECT_LE(std::fabs(gv - wv), 1e-9 * std::max({std::fabs(wv), scale, 1e-3})) << g["b"] << " " << level << " " << f << ": " << gv << " vs " << wv;
      }
    }
  }
  EXPECT_NEAR(got[0]["per_sample"]["bias"].get<double>(), -268435456.0, 1.0);
  EXPECT_EQ(table.rows.size(), 4u);
}

}  // namespace
}  // namespace scalelab::analysis

namespace scalelab::analysis {
namespace {

// Speedup, efficiency and the Karp–Flatt fraction against the fewest-ranks row of the same
// configuration (closed forms).
TEST(ScalingColumns, SpeedupEfficiencyKarpFlatt) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("scalelab-analysis-scaling-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "scaling.db").string();
  testing::build_scaling_db(db);
  Frame f;
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    f = build_frame_from_sweep(store, "scaling");
  }
  fs::remove_all(dir);
  const Column* ranks = f.find("ranks");
  const Column* s = f.find("speedup");
  const Column* e = f.find("efficiency_pct");
  const Column* kf = f.find("karp_flatt");
  ASSERT_TRUE(ranks && s && e && kf);
  const std::map<double, double> eff{{1, 1.0}, {2, 0.95}, {4, 0.85}, {8, 0.7}};
  for (std::size_t i = 0; i < f.rows(); ++i) {
    const double p = ranks->values[i], ef = eff.at(p), sp = p * ef;
    testing::expect_close(s->values[i], Json(sp), "speedup");
    testing::expect_close(e->values[i], Json(100 * ef), "efficiency");
    if (p > 1) testing::expect_close(kf->values[i], Json((1 / sp - 1 / p) / (1 - 1 / p)), "karp-flatt");
    else EXPECT_TRUE(std::isnan(kf->values[i]));
  }
  Json a = analyze(f, {}).json;
  ASSERT_TRUE(a.contains("scaling"));
  EXPECT_EQ(a["scaling"]["rows"][0]["config"], "micro_batch_size=1");
}

}  // namespace
}  // namespace scalelab::analysis
