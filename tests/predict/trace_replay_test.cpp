// The allocator replica against PyTorch itself: the caching allocator's recorded requests of real
// Trainer jobs on an H200 (bench/gpu/hf_memory.py --trace; tests/golden/predict/*.events made by
// tools/predict/trace_to_events.py) replayed through the replica must give the segment peak the
// GPU's allocator reached, to the byte.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "predict/caching_allocator.h"

namespace scalelab::predict {
namespace {

struct Replay {
  std::size_t measured_segment_peak = 0;
  std::size_t peak_reserved = 0;
  std::size_t allocations = 0;
};

Replay replay(const std::string& name) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  EXPECT_TRUE(in.good()) << name;
  Replay r;
  CachingAllocator a(std::size_t{1} << 50);
  std::vector<BlockId> ids;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string op;
    std::size_t v = 0;
    ls >> op >> v;
    if (op == "max_reserved") {
      r.measured_segment_peak = v;
    } else if (op == "a") {
      MallocResult m = a.malloc(v);
      EXPECT_FALSE(m.oom);
      ids.push_back(m.id);
    } else if (op == "f") {
      a.free(ids.at(v));
    }
  }
  r.peak_reserved = a.stats().peak_reserved;
  r.allocations = ids.size();
  return r;
}

class TraceReplay : public ::testing::TestWithParam<const char*> {};

TEST_P(TraceReplay, SegmentPeakEqualsTheGpuAllocators) {
  const Replay r = replay(GetParam());
  ASSERT_GT(r.allocations, 5000u);
  EXPECT_EQ(r.peak_reserved, r.measured_segment_peak);
}

INSTANTIATE_TEST_SUITE_P(H200, TraceReplay,
                         ::testing::Values("llama-bf16mixed-eager-mb6", "llama-bf16-sdpa-mb6", "llama-bf16-eager-mb6"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace scalelab::predict
