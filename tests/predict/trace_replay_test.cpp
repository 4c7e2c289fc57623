// The allocator replica against PyTorch itself: the caching allocator's recorded requests of real
// Trainer jobs on an H200 (bench/gpu/hf_memory.py --trace; tests/golden/predict/*.events made by
// tools/predict/trace_to_events.py) replayed through the replica must give the segment peak the
// GPU's allocator reached, to the byte, and cudaMalloc a new segment at exactly the requests where
// the GPU's did (the goldens' `s ADDR` lines). Once with the replica's own segment addresses (each
// new segment below the others, as the driver placed them in these runs) and once with the
// recorded ones.
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
  std::size_t recorded_segments = 0;   // `s` lines: the GPU's cudaMallocs
  std::size_t segment_mismatches = 0;  // requests where exactly one of the two cudaMalloc'd
  std::size_t first_mismatch = 0;      // its allocation number
};

// `recorded_addresses`: each new segment at the base address the GPU's cudaMalloc gave it instead
// of the replica's own placement.
Replay replay(const std::string& name, bool recorded_addresses) {
  std::ifstream in(std::string(SCALELAB_SOURCE_DIR) + "/tests/golden/predict/" + name + ".events");
  EXPECT_TRUE(in.good()) << name;
  Replay r;
  CachingAllocator a(std::size_t{1} << 50);
  std::vector<BlockId> ids;
  std::string line;
  bool gpu_segment = false;  // the GPU cudaMalloc'd for the next request
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string op;
    std::size_t v = 0;
    ls >> op >> v;
    if (op == "max_reserved") {
      r.measured_segment_peak = v;
    } else if (op == "s") {
      gpu_segment = true;
      ++r.recorded_segments;
      if (recorded_addresses) a.place_next_segment_at(v);
    } else if (op == "a") {
      const std::size_t before = a.stats().num_device_mallocs;
      MallocResult m = a.malloc(v);
      EXPECT_FALSE(m.oom);
      // the first request (the context's 4-byte tensor) predates the recording
      const bool replica_segment = a.stats().num_device_mallocs != before && !ids.empty();
      if (replica_segment != gpu_segment && r.segment_mismatches++ == 0) r.first_mismatch = ids.size();
      gpu_segment = false;
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
  const Replay r = replay(GetParam(), false);
  ASSERT_GT(r.allocations, 5000u);
  ASSERT_GT(r.recorded_segments, 100u);
  EXPECT_EQ(r.peak_reserved, r.measured_segment_peak);
  EXPECT_EQ(r.segment_mismatches, 0u) << "first at allocation " << r.first_mismatch;
}

TEST_P(TraceReplay, WithTheRecordedSegmentAddressesToo) {
  const Replay r = replay(GetParam(), true);
  EXPECT_EQ(r.peak_reserved, r.measured_segment_peak);
  EXPECT_EQ(r.segment_mismatches, 0u) << "first at allocation " << r.first_mismatch;
}

INSTANTIATE_TEST_SUITE_P(H200, TraceReplay,
                         ::testing::Values("llama-bf16mixed-eager-mb6", "llama-bf16-sdpa-mb6", "llama-bf16-eager-mb6",
                                           "llama-fp32-eager-mb1"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace scalelab::predict
