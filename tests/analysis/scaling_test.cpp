#include "analysis/scaling.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace scalelab {
namespace {

ScalingPoint pt(int devices, double tps, std::optional<double> j_per_token = std::nullopt,
                std::optional<double> power_w = std::nullopt) {
  return ScalingPoint{devices, tps, j_per_token, power_w};
}

// 1000 tokens/s on 1 device; 95%, 90%, 80% efficiency at 2, 4, 8.
std::vector<ScalingPoint> study() {
  return {pt(1, 1000, std::nullopt, 300.0), pt(2, 1900, std::nullopt, 560.0), pt(4, 3600, std::nullopt, 1150.0),
          pt(8, 6400, std::nullopt, 2200.0)};
}

TEST(Scaling, MetricsFromKnownNumbers) {
  ScalingOptions o;
  o.price_per_device_hour = 2.0;
  o.token_budget = 1e9;
  const ScalingReport r = analyze_scaling(study(), o);
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.baseline_devices, 1);
  const ScalingRow& one = r.rows[0];
  const ScalingRow& two = r.rows[1];
  const ScalingRow& four = r.rows[2];
  const ScalingRow& eight = r.rows[3];
  EXPECT_DOUBLE_EQ(eight.tokens_per_s_per_device, 800);
  EXPECT_DOUBLE_EQ(two.speedup, 1.9);
  EXPECT_DOUBLE_EQ(eight.speedup, 6.4);
  EXPECT_DOUBLE_EQ(one.efficiency_pct, 100);
  EXPECT_NEAR(two.efficiency_pct, 95, 1e-12);
  EXPECT_NEAR(four.efficiency_pct, 90, 1e-12);
  EXPECT_NEAR(eight.efficiency_pct, 80, 1e-12);
  EXPECT_NEAR(eight.cost_efficiency, 0.8, 1e-12);
  // Karp–Flatt: (1/S - 1/p) / (1 - 1/p).
  EXPECT_FALSE(one.karp_flatt.has_value());
  EXPECT_NEAR(*two.karp_flatt, (1 / 1.9 - 0.5) / 0.5, 1e-12);  // 0.052632
  EXPECT_NEAR(*four.karp_flatt, 1.0 / 27.0, 1e-12);            // (1/3.6 - 1/4) / (3/4)
  EXPECT_NEAR(*eight.karp_flatt, 1.0 / 28.0, 1e-12);           // (1/6.4 - 1/8) / (7/8)
  // Cost per million tokens: price * n / (3600 * T) * 1e6.
  EXPECT_NEAR(*one.cost_per_million_tokens, 2.0 / 3600 / 1000 * 1e6, 1e-12);  // 0.5556
  EXPECT_NEAR(*eight.cost_per_million_tokens, 16.0 / 3600 / 6400 * 1e6, 1e-12);  // 0.6944
  // Energy per token from power: W / (tokens/s).
  EXPECT_NEAR(*one.energy_j_per_token, 0.3, 1e-12);
  EXPECT_NEAR(*two.energy_j_per_token, 560.0 / 1900, 1e-12);
  // Budget: 1e9 tokens take 1e9 / 6400 s on 8 devices.
  EXPECT_NEAR(eight.time_to_budget_s, 156250, 1e-6);
  EXPECT_NEAR(eight.device_hours_to_budget, 8 * 156250 / 3600.0, 1e-9);
  EXPECT_NEAR(*eight.cost_to_budget, 2 * 8 * 156250 / 3600.0, 1e-9);
}

TEST(Scaling, RecommendsPerPurpose) {
  ScalingOptions o;
  o.price_per_device_hour = 2.0;
  const ScalingReport r = analyze_scaling(study(), o);
  ASSERT_EQ(r.recommendations.size(), 3u);
  EXPECT_EQ(r.recommendations[0].purpose, ScalingPurpose::kTime);
  EXPECT_EQ(r.recommendations[0].devices, 8);
  EXPECT_EQ(r.recommendations[1].purpose, ScalingPurpose::kCost);
  EXPECT_EQ(r.recommendations[1].devices, 1);  // efficiency < 100% beyond one device
  EXPECT_EQ(r.recommendations[2].purpose, ScalingPurpose::kEnergy);
  EXPECT_EQ(r.recommendations[2].devices, 2);  // 0.2947 J/token beats 0.3 at one device
  EXPECT_NE(r.recommendations[0].reason.find("8 devices: 43.4 h for 1 B tokens (6.40x, 80.0% efficiency"), std::string::npos)
      << r.recommendations[0].reason;
  EXPECT_NE(r.recommendations[1].reason.find("cost 555.56"), std::string::npos) << r.recommendations[1].reason;
}

TEST(Scaling, PerfectScalingTiesGoToFewerDevicesAndNoEnergyIsSaid) {
  const ScalingReport r = analyze_scaling({pt(1, 100), pt(2, 200), pt(4, 400)});
  EXPECT_NEAR(*r.rows[2].karp_flatt, 0.0, 1e-12);
  EXPECT_EQ(r.recommendations[0].devices, 4);
  EXPECT_EQ(r.recommendations[1].devices, 1);  // same device-hours everywhere: fewest devices
  EXPECT_FALSE(r.recommendations[2].devices.has_value());
  EXPECT_NE(r.recommendations[2].reason.find("no energy figures"), std::string::npos);
}

TEST(Scaling, RepeatsAreAveragedAndBaselineMayBeAboveOne) {
  const ScalingReport r = analyze_scaling({pt(4, 3900), pt(2, 2100), pt(2, 1900), pt(8, 7200, 0.5)});
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.baseline_devices, 2);
  EXPECT_EQ(r.rows[0].samples, 2);
  EXPECT_DOUBLE_EQ(r.rows[0].tokens_per_s, 2000);
  EXPECT_DOUBLE_EQ(r.rows[1].speedup, 1.95);
  EXPECT_NEAR(r.rows[1].efficiency_pct, 97.5, 1e-12);   // 1.95 / (4/2)
  EXPECT_NEAR(*r.rows[1].karp_flatt, (1 / 1.95 - 0.5) / 0.5, 1e-12);
  EXPECT_NEAR(r.rows[2].efficiency_pct, 90, 1e-12);     // 3.6 / 4
  EXPECT_DOUBLE_EQ(*r.rows[2].energy_j_per_token, 0.5);  // measured wins over power
  EXPECT_EQ(r.recommendations[2].devices, 8);            // the only one with energy
}

TEST(Scaling, MarkdownTable) {
  ScalingOptions o;
  o.price_per_device_hour = 2.0;
  const std::string md = render_scaling_markdown(analyze_scaling(study(), o), o);
  EXPECT_NE(md.find("| devices | tokens/s per device | total tokens/s | speedup | efficiency % | cost efficiency | "
                    "cost per 1M tokens | J/token | Karp–Flatt e |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 2 | 950.0 | 1900.0 | 1.90 | 95.0 | 0.950 | 0.5848 | 0.2947 | 0.0526 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 | 1000.0 | 1000.0 | 1.00 | 100.0 | 1.000 | 0.5556 | 0.3 | – |"), std::string::npos) << md;
  EXPECT_NE(md.find("- shortest time: 8 devices"), std::string::npos) << md;
  EXPECT_NE(md.find("- lowest energy: 2 devices"), std::string::npos) << md;
  const std::string plain = render_scaling_markdown(analyze_scaling({pt(1, 10), pt(2, 20)}));
  EXPECT_EQ(plain.find("J/token"), std::string::npos);
  EXPECT_EQ(plain.find("cost per 1M"), std::string::npos);
}

TEST(Scaling, BadInputIsInvalidInput) {
  EXPECT_THROW(analyze_scaling({}), InvalidInput);
  EXPECT_THROW(analyze_scaling({pt(0, 100)}), InvalidInput);
  EXPECT_THROW(analyze_scaling({pt(1, 0)}), InvalidInput);
  ScalingOptions o;
  o.token_budget = -1;
  EXPECT_THROW(analyze_scaling({pt(1, 10)}, o), InvalidInput);
}

}  // namespace
}  // namespace scalelab
