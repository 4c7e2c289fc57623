// The logits warpers against transformers' (tests/golden/data/textgen/warpers.json: random logits
// with many ties, -inf entries, a flat row) and the seeded sampler's properties.
#include "generate/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace scalelab {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> row_of(const nlohmann::json& r) {
  std::vector<float> v;
  for (const auto& x : r) v.push_back(x.is_null() ? kNegInf : x.get<float>());
  return v;
}

TEST(Warpers, KeptSetsAndValuesEqualTransformers) {
  const char* e = std::getenv("SCALELAB_SOURCE_DIR");
  std::ifstream in(std::string((e && *e) ? e : SCALELAB_SOURCE_DIR) + "/tests/golden/data/textgen/warpers.json");
  const auto j = nlohmann::json::parse(in);
  ASSERT_GE(j["cases"].size(), 8u);
  int removed_somewhere = 0, tie_rows = 0;
  for (const auto& c : j["cases"]) {
    SamplingOptions o;
    o.temperature = c["temperature"];
    o.top_k = c["top_k"];
    o.top_p = c["top_p"];
    o.min_tokens_to_keep = c["min_tokens_to_keep"];
    for (std::size_t r = 0; r < j["logits"].size(); ++r) {
      std::vector<float> x = row_of(j["logits"][r]);
      warp_logits(x, o);
      const std::vector<float> want = row_of(c["processed"][r]);
      ASSERT_EQ(x.size(), want.size());
      int kept = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const std::string where = "T=" + std::to_string(o.temperature) + " k=" + std::to_string(o.top_k) +
                                  " p=" + std::to_string(o.top_p) + " row " + std::to_string(r) + " index " +
                                  std::to_string(i);
        ASSERT_EQ(std::isinf(x[i]), std::isinf(want[i])) << where;  // the same kept set
        if (!std::isinf(want[i])) {
          ++kept;
          // logits / T in fp32 on both sides: equal, up to how the division is rounded.
          EXPECT_NEAR(x[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-7f) << where;
        }
      }
      EXPECT_GE(kept, 1);
      if (kept < static_cast<int>(x.size())) ++removed_somewhere;
      // top-k keeps every logit tied with the k-th: more than k survive on some row.
      if (o.top_k > 0 && o.top_p == 1.0 && kept > o.top_k) ++tie_rows;
    }
  }
  EXPECT_GT(removed_somewhere, 50);  // the cases do cut
  EXPECT_GT(tie_rows, 0);            // and exercise ties at the top-k boundary
}

TEST(Warpers, TopKAndTopPByHand) {
  std::vector<float> x = {1, 3, 3, 2, 0};
  apply_top_k(x, 2, 1);  // the 2nd largest is 3: both 3s stay
  EXPECT_EQ(x, (std::vector<float>{kNegInf, 3, 3, kNegInf, kNegInf}));
  std::vector<float> y = {0, 2, 1, 3};  // softmax 0.032, 0.237, 0.087, 0.644 (sorted: 0, 2, 1, 3)
  apply_top_p(y, 0.8, 1);               // cumulative 0.032, 0.119, 0.356, 1: removed where <= 0.2
  EXPECT_EQ(y, (std::vector<float>{kNegInf, 2, kNegInf, 3}));
  std::vector<float> z = {0, 2, 1, 3};
  apply_top_p(z, 0.1, 3);  // would keep only 3; min_tokens_to_keep 3 keeps the top three
  EXPECT_EQ(z, (std::vector<float>{kNegInf, 2, 1, 3}));
}

TEST(Sampler, GreedyIsTheFirstArgmax) {
  TokenSampler s({});
  const std::vector<float> x = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.next(x), 1);
}

TEST(Sampler, SeededDeterministicAndOnlyFromTheKeptSet) {
  SamplingOptions o;
  o.temperature = 0.8;
  o.top_k = 3;
  o.seed = 7;
  std::vector<float> x = {0.1f, 1.0f, 0.5f, 2.0f, -0.3f, 1.5f};
  TokenSampler a(o), b(o);
  std::vector<int> counts(x.size());
  std::vector<std::int32_t> seq_a, seq_b;
  for (int i = 0; i < 20000; ++i) {
    seq_a.push_back(a.next(x));
    seq_b.push_back(b.next(x));
    ++counts[static_cast<std::size_t>(seq_a.back())];
  }
  EXPECT_EQ(seq_a, seq_b);
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);  // outside the top 3
  // The frequencies follow softmax(x / T) over the kept {1, 3, 5}: a fixed seed makes this exact
  // arithmetic, not chance; 20000 draws put each frequency within ~0.01 of its probability (4 sigma).
  const double e1 = std::exp(1.0 / 0.8), e3 = std::exp(2.0 / 0.8), e5 = std::exp(1.5 / 0.8), z = e1 + e3 + e5;
  EXPECT_NEAR(counts[1] / 20000.0, e1 / z, 0.015);
  EXPECT_NEAR(counts[3] / 20000.0, e3 / z, 0.015);
  EXPECT_NEAR(counts[5] / 20000.0, e5 / z, 0.015);
  o.seed = 8;
  TokenSampler c(o);
  std::vector<std::int32_t> seq_c;
  for (int i = 0; i < 20000; ++i) seq_c.push_back(c.next(x));
  EXPECT_NE(seq_a, seq_c);
}

TEST(Sampler, BadFlagsAreInvalidInput) {
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_THROW(validate_sampling(o), InvalidInput);
  o = {};
  o.top_p = 0;
  EXPECT_THROW(validate_sampling(o), InvalidInput);
  o = {};
  o.top_k = -2;
  EXPECT_THROW(validate_sampling(o), InvalidInput);
  o = {};
  o.min_tokens_to_keep = 0;
  EXPECT_THROW(validate_sampling(o), InvalidInput);
}

}  // namespace
}  // namespace scalelab
