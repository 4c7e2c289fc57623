#include "distributed/config_check.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "thread_world.h"

namespace scalelab {
namespace {

using nlohmann::json;

json base() {
  return json{{"model", "llama-small"}, {"micro_batch_size", 4}, {"lr", 5e-5},
              {"optim", {{"beta1", 0.9}, {"beta2", 0.999}}}, {"json", "rank0.json"}};
}

TEST(ConfigHash, IndependentOfKeyOrderSensitiveToValues) {
  const json a = json::parse(R"({"a": 1, "b": {"x": true, "y": [1, 2]}})");
  const json b = json::parse(R"({"b": {"y": [1, 2], "x": true}, "a": 1})");
  const json c = json::parse(R"({"b": {"y": [1, 3], "x": true}, "a": 1})");
  EXPECT_EQ(config_hash(a), config_hash(b));
  EXPECT_NE(config_hash(a), config_hash(c));
}

TEST(ConfigDiff, NamesNestedAndMissingKeys) {
  json other = base();
  other["optim"]["beta2"] = 0.95;
  other.erase("lr");
  other["seed"] = 7;
  const std::vector<ConfigDiff> d = diff_configs(base(), other);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].key, "lr");
  EXPECT_EQ(d[0].other, "(absent)");
  EXPECT_EQ(d[1].key, "optim/beta2");
  EXPECT_EQ(d[1].reference, "0.999");
  EXPECT_EQ(d[1].other, "0.95");
  EXPECT_EQ(d[2].key, "seed");
  EXPECT_EQ(d[2].reference, "(absent)");
  EXPECT_TRUE(diff_configs(base(), base()).empty());
}

TEST(CheckSameConfig, PassesWhenEqualIgnoringPerRankKeys) {
  testing::ThreadWorld world(3);
  world.run([](int r, Communicator& c) {
    json cfg = base();
    cfg["json"] = "rank" + std::to_string(r) + ".json";
    check_same_config(c, cfg, {"json"});
  });
}

TEST(CheckSameConfig, EveryRankLearnsWhichKeyDiffersOnWhichRank) {
  testing::ThreadWorld world(3);
  std::vector<std::string> messages(3);
  world.run([&](int r, Communicator& c) {
    json cfg = base();
    if (r == 2) cfg["micro_batch_size"] = 8;
    try {
      check_same_config(c, cfg);
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const InvalidInput& e) {
      messages[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("rank 2 differs from rank 0 in micro_batch_size (rank 2: 8, rank 0: 4)"), std::string::npos) << m;
    EXPECT_EQ(m.find("rank 1 differs"), std::string::npos) << m;
  }
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[0], messages[2]);
}

}  // namespace
}  // namespace scalelab
