// Summary statistics, energy, alignment and agreement between sources, and the CSV layout, on
// series built by hand.
#include "telemetry/summary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "telemetry/csv_writer.h"

namespace scalelab {
namespace {

using Series = std::map<SeriesKey, SeriesPoints>;

SeriesPoints pts(std::vector<double> t, std::vector<double> v) { return {std::move(t), std::move(v)}; }

TEST(Pearson, PerfectInverseUndefined) {
  EXPECT_NEAR(*pearson_r({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0, 1e-12);
  EXPECT_NEAR(*pearson_r({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0, 1e-12);
  // Known value: x = 1..5, y = 2,4,5,4,5 -> r = 0.7745966692...
  EXPECT_NEAR(*pearson_r({1, 2, 3, 4, 5}, {2, 4, 5, 4, 5}), 0.7745966692414834, 1e-12);
  EXPECT_FALSE(pearson_r({1, 2}, {3, 4}));                 // too few pairs
  EXPECT_FALSE(pearson_r({5, 5, 5}, {1, 2, 3}));           // constant side
  EXPECT_FALSE(pearson_r({0.1, 0.1, 0.1}, {1, 2, 3}));     // constant with rounding in the mean
  EXPECT_FALSE(pearson_r({8e10, 8e10, 8e10}, {1, 2, 3}));  // large constant
}

TEST(Align, NearestWithinToleranceOneToOne) {
  const auto a = pts({0.0, 0.2, 0.4, 0.6}, {1, 2, 3, 4});
  const auto b = pts({0.01, 0.22, 0.23, 0.9}, {10, 20, 30, 40});
  const auto pairs = align_nearest(a, b, 0.05);
  // 0.0<->0.01, 0.2<->0.22 (0.23 is farther), 0.4 and 0.6 have nothing within 0.05.
  EXPECT_EQ(pairs, (std::vector<std::pair<double, double>>{{1, 10}, {2, 20}}));
  // A slow b point is claimed by one a point only: the nearest.
  const auto fast = pts({0.0, 0.01, 0.02}, {1, 2, 3});
  const auto slow = pts({0.018}, {9});
  EXPECT_EQ(align_nearest(fast, slow, 0.1), (std::vector<std::pair<double, double>>{{3, 9}}));
  EXPECT_TRUE(align_nearest(a, pts({}, {}), 1.0).empty());
}

TEST(Energy, Trapezoid) {
  EXPECT_DOUBLE_EQ(integrate_trapezoid(pts({0, 1, 3}, {100, 200, 200})), 150 + 400);
  EXPECT_DOUBLE_EQ(integrate_trapezoid(pts({5}, {100})), 0.0);
}

TEST(Agreement, RowsForComparableSourcesOnTheSameDevice) {
  Series s;
  s[{"nvml", "cuda:0", "power_w"}] = pts({0, 1, 2, 3}, {100, 200, 300, 400});
  s[{"nvidia-smi", "cuda:0", "power_w"}] = pts({0.05, 1.05, 2.05, 3.05}, {110, 190, 320, 380});
  s[{"nvml", "cuda:0", "mem_used_bytes"}] = pts({0, 1, 2}, {1e9, 2e9, 3e9});
  s[{"engine", "cuda:0", "reserved_bytes"}] = pts({0, 1, 2}, {0.9e9, 1.9e9, 2.9e9});
  s[{"nvml", "cuda:1", "power_w"}] = pts({0, 1}, {1, 2});  // no partner on cuda:1
  const auto rows = compute_agreement(s, 0.1);
  ASSERT_EQ(rows.size(), 2u);
  const auto& mem = rows[0];
  EXPECT_EQ(mem.quantity, "mem_used_bytes");
  EXPECT_EQ(mem.source_b, "engine");
  EXPECT_EQ(mem.n, 3u);
  EXPECT_NEAR(*mem.pearson_r, 1.0, 1e-12);
  EXPECT_NEAR(mem.mean_diff, -1e8, 1e-3);
  const auto& pw = rows[1];
  EXPECT_EQ(pw.quantity, "power_w");
  EXPECT_EQ(pw.n, 4u);
  EXPECT_DOUBLE_EQ(pw.mean_diff, (10 - 10 + 20 - 20) / 4.0);
  EXPECT_DOUBLE_EQ(pw.mean_abs_diff, (10 + 10 + 20 + 20) / 4.0);
  EXPECT_DOUBLE_EQ(pw.mean_a, 250.0);
  EXPECT_DOUBLE_EQ(pw.mean_b, 250.0);
  EXPECT_GT(*pw.pearson_r, 0.95);
  // A tolerance under the 50 ms offset drops the power row; the engine row is exactly aligned.
  EXPECT_EQ(compute_agreement(s, 0.01).size(), 1u);
}

TEST(Summarize, AveragesMaximaCountersAndJPerToken) {
  Series s;
  s[{"nvml", "cuda:0", "gpu_util_pct"}] = pts({0, 1, 2, 3}, {0, 50, 100, 50});
  s[{"nvml", "cuda:0", "energy_j"}] = pts({0, 1, 2, 3}, {1000, 1200, 1500, 1900});
  s[{"nvml", "cuda:0", "power_w"}] = pts({0, 1, 2, 3}, {100, 300, 300, 400});
  s[{"nvml", "cuda:1", "power_w"}] = pts({0, 2}, {100, 100});  // no counter: integrated
  s[{"process", "process", "cpu_util_pct"}] = pts({1, 2}, {150, 250});
  s[{"host", "host", "mem_used_bytes"}] = pts({0, 1}, {4, 6});
  s[{"host", "rapl:package-0", "energy_j"}] = pts({0, 3}, {0, 60});
  s[{"host", "hwmon:coretemp/Core 0", "temperature_c"}] = pts({0, 1}, {50, 60});
  const auto j = summarize(s, {900.0, 0.1});
  EXPECT_DOUBLE_EQ(j["duration_s"].get<double>(), 3.0);
  const auto& g0 = j["devices"]["cuda:0"];
  EXPECT_DOUBLE_EQ(g0["metrics"]["nvml"]["gpu_util_pct"]["avg"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(g0["metrics"]["nvml"]["gpu_util_pct"]["max"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(g0["metrics"]["nvml"]["energy_j"]["delta"].get<double>(), 900.0);
  EXPECT_FALSE(g0["metrics"]["nvml"]["energy_j"].contains("avg"));
  EXPECT_DOUBLE_EQ(g0["energy_j"].get<double>(), 900.0);  // the counter wins over power
  EXPECT_DOUBLE_EQ(g0["avg_power_w"].get<double>(), 300.0);
  EXPECT_DOUBLE_EQ(g0["j_per_token"].get<double>(), 1.0);
  const auto& g1 = j["devices"]["cuda:1"];
  EXPECT_EQ(g1["energy_method"], "nvml integrated power");
  EXPECT_DOUBLE_EQ(g1["energy_j"].get<double>(), 200.0);
  // The run: both GPUs' energy; power over the longest span.
  EXPECT_EQ(j["energy_scope"], "gpu");
  EXPECT_DOUBLE_EQ(j["energy_j"].get<double>(), 1100.0);
  EXPECT_DOUBLE_EQ(j["avg_power_w"].get<double>(), 1100.0 / 3.0);
  EXPECT_DOUBLE_EQ(j["j_per_token"].get<double>(), 1100.0 / 900.0);
  EXPECT_DOUBLE_EQ(j["process"]["cpu_util_pct"]["avg"].get<double>(), 200.0);
  EXPECT_DOUBLE_EQ(j["host"]["mem_used_bytes"]["max"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(j["host"]["rapl"]["rapl:package-0"]["energy_j"].get<double>(), 60.0);
  EXPECT_DOUBLE_EQ(j["host"]["rapl"]["rapl:package-0"]["avg_power_w"].get<double>(), 20.0);
  EXPECT_DOUBLE_EQ(
      j["host"]["temperatures"]["hwmon:coretemp/Core 0"]["temperature_c"]["max"].get<double>(), 60.0);
}

TEST(Summarize, CpuPackageEnergyWithoutGpus) {
  Series s;
  s[{"host", "rapl:package-0", "energy_j"}] = pts({0, 2}, {0, 30});
  s[{"host", "rapl:package-1", "energy_j"}] = pts({0, 2}, {0, 10});
  s[{"host", "rapl:psys", "energy_j"}] = pts({0, 2}, {0, 99});  // not a package: not counted
  const auto j = summarize(s, {std::nullopt, 0.1});
  EXPECT_EQ(j["energy_scope"], "cpu_package");
  EXPECT_DOUBLE_EQ(j["energy_j"].get<double>(), 40.0);
  EXPECT_DOUBLE_EQ(j["avg_power_w"].get<double>(), 20.0);
  EXPECT_TRUE(j["j_per_token"].is_null());
  EXPECT_TRUE(summarize({}, {1.0, 0.1})["energy_j"].is_null());
}

TEST(Csv, RowsColumnsAndQuoting) {
  const std::vector<Sample> samples = {
      {0.0, "nvml", "cuda:0", "gpu_util_pct", 10},
      {0.0, "nvml", "cuda:0", "mem_used_bytes", 85899345920.0},
      {0.0, "host", "hwmon:chip/Core, 0", "temperature_c", 45.5},
      {0.2, "nvml", "cuda:0", "gpu_util_pct", 20},
      {0.2, "nvml", "cuda:0", "zeta_custom", 1.25},
  };
  std::ostringstream out;
  write_telemetry_csv(samples, out);
  EXPECT_EQ(out.str(),
            "t_s,source,device,gpu_util_pct,mem_used_bytes,temperature_c,zeta_custom\n"
            "0.000,host,\"hwmon:chip/Core, 0\",,,45.5,\n"
            "0.000,nvml,cuda:0,10,85899345920,,\n"
            "0.200,nvml,cuda:0,20,,,1.25\n");
}

}  // namespace
}  // namespace scalelab
