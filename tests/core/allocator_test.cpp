#include "core/allocator.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace scalelab {
namespace {

TEST(Allocator, CachesAndCountsPeaks) {
  DeviceAllocator a(make_host_backend(), 1 << 20);
  void* p = a.allocate(1000);
  EXPECT_EQ(a.stats().allocated, 1024u);
  EXPECT_EQ(a.stats().reserved, 1024u);
  a.deallocate(p);
  EXPECT_EQ(a.stats().allocated, 0u);
  EXPECT_EQ(a.stats().reserved, 1024u);  // cached
  void* q = a.allocate(900);             // same rounded size: reused
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().num_backend_allocations, 1u);
  a.deallocate(q);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(a.stats().peak_reserved, 1024u);
  EXPECT_EQ(a.stats().peak_allocated, 1024u);
}

TEST(Allocator, MidSizeRequestsShareTwentyMiBSegments) {
  const std::size_t MiB = std::size_t{1} << 20;
  DeviceAllocator a(make_host_backend(), std::size_t{1} << 30);
  // 1.125 MiB (one SmolLM2 activation at 512 tokens): above the small pool, below kMidRequest.
  const std::size_t act = 1179648;
  std::vector<void*> live;
  for (int i = 0; i < 17; ++i) live.push_back(a.allocate(act));
  // Seventeen of them in one 20 MiB segment, adjacent; a 2 MiB segment each would be 34 MiB.
  EXPECT_EQ(a.stats().reserved, DeviceAllocator::kMidSegmentBytes);
  EXPECT_EQ(a.stats().num_backend_allocations, 1u);
  for (int i = 1; i < 17; ++i) EXPECT_EQ(static_cast<char*>(live[i]) - static_cast<char*>(live[i - 1]), static_cast<std::ptrdiff_t>(act));
  // The segment's last 0.875 MiB cannot hold another: a new segment.
  live.push_back(a.allocate(act));
  EXPECT_EQ(a.stats().reserved, 2 * DeviceAllocator::kMidSegmentBytes);
  for (void* p : live) a.deallocate(p);
  // Freed, the segments serve any large request that fits (here 10 MiB + 1 from the first).
  void* fits = a.allocate(DeviceAllocator::kMidRequest + 1);
  EXPECT_EQ(fits, live[0]);
  EXPECT_EQ(a.stats().reserved, 2 * DeviceAllocator::kMidSegmentBytes);
  a.deallocate(fits);
  // kMidRequest and above, with nothing cached: the request rounded up to 2 MiB, as before.
  DeviceAllocator fresh(make_host_backend(), std::size_t{1} << 30);
  void* big = fresh.allocate(DeviceAllocator::kMidRequest + 1);
  EXPECT_EQ(fresh.stats().reserved, 12 * MiB);
  fresh.deallocate(big);
  // Under a capacity too tight for 20 MiB: the request rounded to 2 MiB.
  DeviceAllocator tight(make_host_backend(), 8 * MiB);
  void* p = tight.allocate(3 * MiB);
  EXPECT_EQ(tight.stats().reserved, 4 * MiB);
  tight.deallocate(p);
}

TEST(Allocator, SplitsBlocksAndMergesThemBack) {
  DeviceAllocator a(make_host_backend(), 1 << 30);
  // Small requests share one 2 MiB segment.
  void* s1 = a.allocate(4096);
  void* s2 = a.allocate(4096);
  EXPECT_EQ(static_cast<char*>(s2) - static_cast<char*>(s1), 4096);
  EXPECT_EQ(a.stats().reserved, DeviceAllocator::kSegmentBytes);
  EXPECT_EQ(a.stats().allocated, 8192u);
  a.deallocate(s1);
  a.deallocate(s2);  // merges with s1 and the rest: one free block spans the segment again
  void* s3 = a.allocate(DeviceAllocator::kSmallRequest);
  EXPECT_EQ(s3, s1);
  EXPECT_EQ(a.stats().reserved, DeviceAllocator::kSegmentBytes);
  a.deallocate(s3);
  // A large block serves smaller large requests by splitting; the pieces merge when freed.
  void* big = a.allocate(10 << 20);
  EXPECT_EQ(a.stats().reserved, DeviceAllocator::kSegmentBytes + (10u << 20));
  a.deallocate(big);
  void* p3 = a.allocate(3 << 20);
  void* p7 = a.allocate(7 << 20);
  EXPECT_EQ(p3, big);
  EXPECT_EQ(static_cast<char*>(p7) - static_cast<char*>(p3), 3 << 20);
  EXPECT_EQ(a.stats().num_backend_allocations, 2u);
  a.deallocate(p3);
  a.deallocate(p7);
  void* again = a.allocate(10 << 20);
  EXPECT_EQ(again, big);
  a.deallocate(again);
  // Small requests never pin a large segment: they come from their own pool.
  void* tiny = a.allocate(512);
  EXPECT_NE(tiny, big);
  a.deallocate(tiny);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
}

TEST(Allocator, OutOfMemoryIsTypedAndCarriesUsage) {
  DeviceAllocator a(make_host_backend(), 1 << 20);
  void* p = a.allocate(600 * 1024);  // a tight capacity gets request-sized segments
  try {
    a.allocate(600 * 1024, "logits");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested(), 600u * 1024);
    EXPECT_EQ(e.allocated(), 600u * 1024);
    EXPECT_EQ(e.capacity(), 1u << 20);
    EXPECT_NE(std::string(e.what()).find("logits"), std::string::npos);
    EXPECT_EQ(exit_code(e.kind()), 3);
  }
  a.deallocate(p);
}

TEST(Allocator, FlushesCacheBeforeGivingUp) {
  DeviceAllocator a(make_host_backend(), 1 << 20);
  void* p = a.allocate(700 * 1024);
  a.deallocate(p);                   // cached: its segment stays reserved
  void* r = a.allocate(800 * 1024);  // does not fit beside it: the free segment is released first
  EXPECT_EQ(a.stats().num_cache_flushes, 1u);
  EXPECT_EQ(a.stats().reserved, 800u * 1024);
  a.deallocate(r);
}

TEST(Allocator, TensorsReturnTheirBlocks) {
  DeviceAllocator a(make_host_backend(), 1 << 24);
  {
    Tensor t = Tensor::zeros({16, 32}, DType::kF32, a);
    EXPECT_EQ(a.stats().allocated, 2048u);
    Tensor v = t.slice(4, 8);
    EXPECT_EQ(v.shape(), (Shape{4, 32}));
    EXPECT_EQ(v.data<float>() - t.data<float>(), 4 * 32);
  }
  EXPECT_EQ(a.stats().allocated, 0u);
}

TEST(Allocator, ParsesSizes) {
  EXPECT_EQ(parse_bytes("4GiB", "x"), 4ull << 30);
  EXPECT_EQ(parse_bytes("80GB", "x"), 80'000'000'000ull);
  EXPECT_EQ(parse_bytes("1.5G", "x"), 3ull << 29);
  EXPECT_EQ(parse_bytes("512MiB", "x"), 512ull << 20);
  EXPECT_EQ(parse_bytes("123", "x"), 123u);
  EXPECT_THROW(parse_bytes("lots", "--device-memory"), InvalidInput);
  EXPECT_THROW(parse_bytes("0", "--device-memory"), InvalidInput);
  EXPECT_THROW(parse_bytes("12XB", "--device-memory"), InvalidInput);
}

}  // namespace
}  // namespace scalelab
