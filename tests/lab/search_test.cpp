// The OOM search's logic over a simulated device: every limit is found exactly, and always
// verified by probing b (fits) and b+1 (out of memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "lab/oom_search.h"

namespace scalelab::lab {
namespace {

bool probed(const OomSearchTrace& t, int b) { return std::find(t.probed.begin(), t.probed.end(), b) != t.probed.end(); }

TEST(OomSearch, FindsAndVerifiesEveryLimitFromAnyHint) {
  for (int limit = 0; limit <= 70; ++limit) {
    for (int hint : {1, 3, 8, 33, 64, 100}) {
      for (bool estimate : {false, true}) {
        OomSearchSettings s;
        s.hint = hint;
        s.hint_is_estimate = estimate;
        s.max_micro_batch = 4096;
        int calls = 0;
        OomSearchTrace t = search_max_fit(
            [&](int b) {
              ++calls;
              return b <= limit;
            },
            s);
        SCOPED_TRACE("limit " + std::to_string(limit) + " hint " + std::to_string(hint));
        EXPECT_EQ(t.max_fit, limit);
        EXPECT_FALSE(t.capped);
        EXPECT_TRUE(probed(t, limit + 1));
        if (limit > 0) {
          EXPECT_TRUE(probed(t, limit));
        }
        EXPECT_EQ(calls, static_cast<int>(t.probed.size()));  // nothing probed twice
        EXPECT_LE(calls, 2 * static_cast<int>(std::log2(std::max(limit, hint) + 1)) + 4);
      }
    }
  }
}

TEST(OomSearch, ExactEstimateNeedsTwoTrials) {
  OomSearchSettings s;
  s.hint = 37;
  s.hint_is_estimate = true;
  OomSearchTrace t = search_max_fit([](int b) { return b <= 37; }, s);
  EXPECT_EQ(t.max_fit, 37);
  EXPECT_EQ(t.probed, (std::vector<int>{37, 38}));
}

TEST(OomSearch, DoublingThenBisection) {
  OomSearchSettings s;
  OomSearchTrace t = search_max_fit([](int b) { return b <= 12; }, s);
  EXPECT_EQ(t.probed, (std::vector<int>{1, 2, 4, 8, 16, 12, 14, 13}));
  EXPECT_EQ(t.max_fit, 12);
}

TEST(OomSearch, CappedAtTheMaximum) {
  OomSearchSettings s;
  s.max_micro_batch = 20;
  OomSearchTrace t = search_max_fit([](int) { return true; }, s);
  EXPECT_TRUE(t.capped);
  EXPECT_EQ(t.max_fit, 20);
  EXPECT_EQ(t.probed.back(), 20);
  s.max_micro_batch = 0;
  EXPECT_THROW(search_max_fit([](int) { return true; }, s), InvalidInput);
}

TEST(OomSearch, NothingFits) {
  OomSearchTrace t = search_max_fit([](int) { return false; }, OomSearchSettings{});
  EXPECT_EQ(t.max_fit, 0);
  EXPECT_EQ(t.probed, (std::vector<int>{1}));
}

TEST(OomSearch, AProbeFailureStopsTheSearch) {
  struct Boom {};
  EXPECT_THROW(search_max_fit(
                   [](int b) {
                     if (b > 4) throw Boom{};
                     return true;
                   },
                   OomSearchSettings{}),
               Boom);
}

TEST(OomSearch, ResultRoundTripsThroughJson) {
  OomSearchResult r;
  r.max_micro_batch_size = 12;
  r.plan_estimate = 11;
  r.probes = {{11, 1, TrialStatus::kOk}, {12, 2, TrialStatus::kOk}, {13, 3, TrialStatus::kOom}};
  OomSearchResult back = OomSearchResult::from_json(r.to_json());
  EXPECT_EQ(back.max_micro_batch_size, 12);
  ASSERT_TRUE(back.plan_estimate);
  EXPECT_EQ(*back.plan_estimate, 11);
  ASSERT_EQ(back.probes.size(), 3u);
  EXPECT_EQ(back.probes[2].status, TrialStatus::kOom);
  EXPECT_EQ(back.probes[2].trial_id, 3);
}

}  // namespace
}  // namespace scalelab::lab
