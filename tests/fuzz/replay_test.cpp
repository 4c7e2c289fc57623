// Every committed fuzz input (tests/fuzz/corpus/<target>/) replayed through its target in the
// normal suite, so CI holds the parsers to the fuzz contract (accepted, or InvalidInput naming
// the file) without building the libFuzzer harnesses. The seeds (seed-*) are valid inputs and
// must be accepted; inputs the fuzzer found (crash-*, found-*) are the regressions of fixed bugs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/targets.h"

namespace scalelab::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class Replay : public ::testing::TestWithParam<std::string> {};

TEST_P(Replay, EveryCorpusInputIsAcceptedOrATypedRejection) {
  const Target& t = target(GetParam());
  const fs::path dir = fs::path(SCALELAB_SOURCE_DIR) / "tests/fuzz/corpus" / t.name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int inputs = 0, seeds = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto bytes = read_bytes(e.path());
    const std::string file = e.path().filename().string();
    Outcome o = Outcome::kRejected;
    ASSERT_NO_THROW(o = t.run(bytes.data(), bytes.size())) << t.name << " on " << e.path();
    ++inputs;
    // The index seeds guess the shard layout; the fuzzer finds the right one.
    if (file.rfind("seed-", 0) == 0 && std::string(t.name) != "checkpoint_index") {
      ++seeds;
      EXPECT_EQ(o, Outcome::kAccepted) << e.path() << " is a valid seed but was rejected: " << last_rejection();
    }
  }
  EXPECT_GT(inputs, 0);
  if (std::string(t.name) != "checkpoint_index") {
    EXPECT_GT(seeds, 0);
  }
}

std::vector<std::string> names() {
  std::vector<std::string> n;
  for (const auto& t : targets()) n.push_back(t.name);
  return n;
}

INSTANTIATE_TEST_SUITE_P(Fuzz, Replay, ::testing::ValuesIn(names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace scalelab::fuzz
