// #2 scaling curves (analysis/scaling_curves.h) against make_golden.py's formulas on its scaling
// sweep (tests/golden/analysis/scaling_sweep.json: two models x micro-batch x sequence length at
// 1, 2, 4, 8 ranks, NVML and nvidia-smi power per device), and the energy integral's closed forms.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "analysis/analyze.h"
#include "analysis/frame.h"
#include "analysis/scaling_curves.h"
#include "golden_util.h"
#include "lab/store.h"

namespace scalelab::analysis {
namespace {

using namespace testing;
namespace fs = std::filesystem;

struct ScalingGolden {
  Json expected;
  Analysis analysis;
};

ScalingGolden run_golden(std::optional<double> price, const std::string& tag) {
  ScalingGolden g;
  g.expected = read_json_file(golden_dir() + "/expected.json")["scaling_curves"];
  const fs::path dir = fs::temp_directory_path() / ("scalelab-scaling-curves-" + tag + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "scaling.db").string();
  build_golden_db(db, read_json_file(golden_dir() + "/scaling_sweep.json"));
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    Frame f = build_frame_from_sweep(store, "golden-scaling");
    AnalyzeOptions opt;
    opt.targets = {"tokens_per_s"};
    opt.trees = false;
    g.analysis = analyze(f, opt);
    add_scaling_curves(g.analysis, f, store, "golden-scaling", price);
  }
  fs::remove_all(dir);
  return g;
}

using Key = std::tuple<std::string, int, int, int>;  // model, micro-batch, seq len, devices

// The memory plan's parts stored per trial (plan_<part>_bytes) stay out of the analysis; the
// planned total is an outcome like the measured peak.
TEST(FrameFromSweep, PlanPartsAreNotOutcomes) {
  const fs::path dir = fs::temp_directory_path() / ("scalelab-plan-parts-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    lab::ResultsStore store((dir / "r.db").string(), lab::ResultsStore::Mode::kReadWrite);
    const std::int64_t sw = store.ensure_sweep("parts", "sweep", {});
    for (int mbs : {1, 2, 4}) {
      lab::TrialRecord r;
      r.config_hash = lab::fnv1a_hex(std::to_string(mbs));
      r.config = {{"params", {{"micro_batch_size", mbs}}}};
      r.status = lab::TrialStatus::kOk;
      r.metrics = {{"tokens_per_s", 100.0 * mbs + mbs * mbs},
                   {"plan_total_bytes", 1000.0 * mbs},
                   {"plan_activations_bytes", 600.0 * mbs},
                   {"plan_weights_bytes", 400.0}};
      r.started_at = r.ended_at = lab::utc_now_iso();
      store.insert_trial(sw, r);
    }
    Frame f = build_frame_from_sweep(store, "parts");
    std::set<std::string> names;
    for (const auto& c : f.columns) names.insert(c.name);
    EXPECT_TRUE(names.count("plan_total_bytes"));
    EXPECT_TRUE(names.count("tokens_per_s"));
    EXPECT_FALSE(names.count("plan_activations_bytes"));
    EXPECT_FALSE(names.count("plan_weights_bytes"));
  }
  fs::remove_all(dir);
}

TEST(ScalingCurves, RowsMatchTheGoldenFormulas) {
  auto g = run_golden(2.5, "rows");
  const Json& got = g.analysis.json["scaling_curves"];
  ASSERT_TRUE(got.is_object()) << g.analysis.json["problems"].dump();
  EXPECT_EQ(got["price_per_gpu_hour"].get<double>(), g.expected["price_per_gpu_hour"].get<double>());
  EXPECT_EQ(got["x_axes"], Json({"micro_batch_size", "seq_len"}));
  EXPECT_TRUE(got["energy"].get<bool>());
  std::map<Key, Json> by;
  for (const auto& r : got["rows"])
    by[{r["model"].get<std::string>(), static_cast<int>(r["micro_batch_size"].get<double>()), static_cast<int>(r["seq_len"].get<double>()),
        r["devices"].get<int>()}] = r;
  ASSERT_EQ(by.size(), g.expected["rows"].size());
  for (const auto& w : g.expected["rows"]) {
    Key k{w["model"].get<std::string>(), w["micro_batch_size"].get<int>(), w["seq_len"].get<int>(), w["devices"].get<int>()};
    ASSERT_TRUE(by.count(k)) << w.dump();
    const Json& r = by[k];
    const std::string what = w["model"].get<std::string>() + " mb " + std::to_string(std::get<1>(k)) + " seq " +
                             std::to_string(std::get<2>(k)) + " n " + std::to_string(std::get<3>(k));
    for (const char* f : {"tokens_per_s", "speedup", "efficiency_pct", "karp_flatt", "cost_per_million_tokens", "j_per_token"})
      expect_close(r[f], w[f], what + " " + f);
    expect_close(r["global_batch"], Json(static_cast<double>(std::get<1>(k) * std::get<3>(k))), what + " global batch");
    EXPECT_NE(r["series"].get<std::string>().find(std::to_string(std::get<3>(k)) + " device"), std::string::npos) << r["series"];
  }
}

TEST(ScalingCurves, SummaryPerModelAndDeviceCountMatchesNumpy) {
  auto g = run_golden(2.5, "summary");
  const Json& got = g.analysis.json["scaling_curves"]["summary"];
  ASSERT_EQ(got.size(), g.expected["summary"].size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Json& w = g.expected["summary"][i];
    const Json& r = got[i];
    EXPECT_EQ(r["model"], w["model"]);
    EXPECT_EQ(r["devices"], w["devices"]);
    EXPECT_EQ(r["n"], w["n"]);
    for (const char* f : {"efficiency_min", "efficiency_q25", "efficiency_median", "efficiency_q75", "efficiency_max", "speedup_median",
                          "karp_flatt_median", "cost_per_million_tokens_median", "j_per_token_median"})
      expect_close(r[f], w[f], w["model"].get<std::string>() + " n " + std::to_string(w["devices"].get<int>()) + " " + f);
  }
  // The finding per model, and the tables.
  ASSERT_EQ(g.analysis.json["scaling_curves"]["findings"].size(), 2u);
  bool curves = false, summary = false;
  for (const auto& [stem, t] : g.analysis.tables) {
    curves |= stem == "scaling_curves" && t.rows.size() == g.expected["rows"].size();
    summary |= stem == "scaling_summary" && t.rows.size() == 8;
  }
  EXPECT_TRUE(curves && summary);
  EXPECT_NE(g.analysis.markdown.find("## Scaling curves"), std::string::npos);
}

TEST(ScalingCurves, WithoutAPriceTheCostIsNotComputedAndSaysWhy) {
  auto g = run_golden(std::nullopt, "noprice");
  const Json& got = g.analysis.json["scaling_curves"];
  EXPECT_TRUE(got["price_per_gpu_hour"].is_null());
  for (const auto& r : got["rows"]) EXPECT_TRUE(r["cost_per_million_tokens"].is_null());
  bool said = false;
  for (const auto& p : g.analysis.json["problems"]) said |= p.get<std::string>().find("--price-per-gpu-hour") != std::string::npos;
  EXPECT_TRUE(said) << g.analysis.json["problems"].dump();
}

// A grad_accum_steps that does not vary is dropped from the table as constant; the global batch
// still counts it (the sweep's value, read from the trials).
TEST(ScalingCurves, GlobalBatchCountsAConstantGradAccum) {
  Json sweep = read_json_file(golden_dir() + "/scaling_sweep.json");
  for (auto& t : sweep["trials"]) t["params"]["grad_accum_steps"] = 4;
  const fs::path dir = fs::temp_directory_path() / ("scalelab-scaling-gas-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "s.db").string();
  build_golden_db(db, sweep);
  Json rows;
  {
    lab::ResultsStore store(db, lab::ResultsStore::Mode::kReadOnly);
    Frame f = build_frame_from_sweep(store, "golden-scaling");
    EXPECT_EQ(f.find("grad_accum_steps"), nullptr);
    AnalyzeOptions opt;
    opt.targets = {"tokens_per_s"};
    opt.trees = false;
    Analysis a = analyze(f, opt);
    add_scaling_curves(a, f, store, "golden-scaling", std::nullopt);
    rows = a.json["scaling_curves"]["rows"];
  }
  fs::remove_all(dir);
  ASSERT_EQ(rows.size(), 48u);
  for (const auto& r : rows)
    EXPECT_EQ(r["global_batch"].get<double>(), r["micro_batch_size"].get<double>() * r["devices"].get<double>() * 4) << r.dump();
}

lab::TelemetrySample power(double t, const std::string& dev, double w, const std::string& source = "nvml") {
  return {0, t, source, dev, "power_w", w};
}

TEST(TrialEnergy, ConstantPowerGivesPowerOverThroughput) {
  std::vector<lab::TelemetrySample> s;
  for (int k = 0; k < 12; ++k) {
    s.push_back(power(0.5 * k, "0", 100));
    s.push_back(power(0.5 * k, "1", 150));
  }
  auto j = trial_j_per_token(s, 500.0);
  ASSERT_TRUE(j.has_value());
  EXPECT_DOUBLE_EQ(*j, 250.0 / 500.0);
}

TEST(TrialEnergy, TrapezoidOverTheSteadyWindowOnly) {
  // Power ramps linearly 100 -> 190 W over t = 0..9 s (10 samples): the steady window starts at
  // t0 + 0.1 (t1 - t0) = 0.9 s, so the samples t = 1..9 count, whose trapezoid mean is exact for a
  // line: (110 + 190) / 2 = 150 W. The warm-up sample at t = 0 is left out.
  std::vector<lab::TelemetrySample> s;
  for (int k = 0; k < 10; ++k) s.push_back(power(k, "0", 100 + 10.0 * k));
  auto j = trial_j_per_token(s, 3.0);
  ASSERT_TRUE(j.has_value());
  EXPECT_NEAR(*j, 150.0 / 3.0, 1e-12);
  // Uneven times: the integral weights each interval by its length (a plain mean would not).
  std::vector<lab::TelemetrySample> u = {power(0, "0", 100), power(1, "0", 100), power(3, "0", 200)};
  EXPECT_NEAR(*trial_j_per_token(u, 1.0), (100.0 * 1 + 150.0 * 2) / 3.0, 1e-12);
}

TEST(TrialEnergy, PrefersNvmlAndSaysWhyWhenItCannot) {
  std::vector<lab::TelemetrySample> s = {power(0, "0", 100, "nvidia-smi"), power(1, "0", 100, "nvidia-smi"), power(0, "0", 50), power(1, "0", 50)};
  EXPECT_DOUBLE_EQ(*trial_j_per_token(s, 10.0), 5.0);
  std::string why;
  EXPECT_FALSE(trial_j_per_token({}, 10.0, &why).has_value());
  EXPECT_NE(why.find("no power samples"), std::string::npos) << why;
  EXPECT_FALSE(trial_j_per_token({power(0, "0", 100)}, 10.0, &why).has_value());
  EXPECT_NE(why.find("fewer than 2"), std::string::npos) << why;
  EXPECT_FALSE(trial_j_per_token(s, 0.0, &why).has_value());
}

}  // namespace
}  // namespace scalelab::analysis
