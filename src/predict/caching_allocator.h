#pragma once
// A replica of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, the "native"
// backend), for predicting torch.cuda.max_memory_reserved / max_memory_allocated of a job before
// it runs. It holds no memory: blocks are (address, size) records in simulated segments.
//
// Why a replica and not src/core/allocator.h: scalelab's own allocator follows the same broad
// policy but differs in the details that decide a prediction to the segment (the 20 MiB buffers
// for 1-10 MiB requests, the large pool's "split only if more than 1 MiB remains", the
// max_split_size / max_non_split_rounding_size rules, and the order of the free-and-retry steps),
// and it allocates real memory. This one models only PyTorch's policy, single device, one stream
// (a training step on the default stream):
//
//  - round_size: requests are rounded up to a multiple of 512 B (minimum 512 B); with
//    roundup_power2_divisions set, requests above 512 B round up to the nearest of N divisions of
//    their power-of-two interval (as PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N).
//  - pools: rounded requests <= 1 MiB come from the small pool, others from the large pool.
//  - get_allocation_size (the cudaMalloc of a new segment): small -> 2 MiB; large below 10 MiB ->
//    20 MiB; 10 MiB and above -> the request rounded up to 2 MiB.
//  - get_free_block: the smallest free block of the pool not smaller than the request (ties: the
//    lowest address); refused when the request is below max_split_size but the block is not
//    (oversize blocks serve only oversize requests), or when the request is at least
//    max_split_size and the block exceeds it by max_non_split_rounding_size (default 20 MiB) or more.
//  - should_split: small pool when at least 512 B remain; large pool when the request is below
//    max_split_size and more than 1 MiB remains (with expandable segments: at least 512 B).
//    An unsplit block counts whole in allocated bytes (as PyTorch's stats do).
//  - free: the block merges with its free neighbours within its segment.
//  - malloc when no cached block fits: cudaMalloc a new segment; if the device is full, release
//    cached oversize blocks (only with max_split_size set: the smallest single one big enough,
//    else the largest ones until enough) and retry; then release every cached block that is a
//    whole segment (empty_cache) and retry; then out of memory.
//  - expandable_segments: one segment per pool that grows by mapping pages (2 MiB small, 20 MiB
//    large) at its end; freed pages at the end stay mapped until empty_cache or the OOM retry.
//
// Addresses: a new segment is placed below every segment allocated so far. cudaMalloc promises no
// order, but in the H200 traces (bench/gpu/hf_memory.py --trace: four Trainer runs, 128-318
// segments each) the driver handed out addresses top-down: of the pairs of large-pool segments,
// 90-98 % lie in that order, and nearly all the others involve a segment made while the model
// loaded (the rest a segment under 32 MiB, which the driver packs differently). It matters only to
// break best-fit ties between equal-sized free blocks (the lowest address wins: the newest
// segment's block); with the opposite order the replay of the fp32 micro-batch-1 trace ends 64 MiB
// short (tests/predict/trace_replay_test.cpp).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace scalelab::predict {

inline constexpr std::size_t kMinBlockSize = 512;               // round_size's unit
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;   // largest small-pool request
inline constexpr std::size_t kSmallBuffer = std::size_t{2} << 20; // small-pool segment
inline constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;  // segment for 1-10 MiB requests
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kRoundLarge = std::size_t{2} << 20;  // cudaMalloc rounding above 10 MiB
inline constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();

// PYTORCH_CUDA_ALLOC_CONF, the parts that change the policy.
struct AllocatorConfig {
  std::size_t max_split_size = kNoLimit;               // max_split_size_mb
  std::size_t max_non_split_rounding_size = kLargeBuffer;  // max_non_split_rounding_mb
  std::size_t roundup_power2_divisions = 0;            // 0: off
  bool expandable_segments = false;
};
// Parses "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4"; throws
// InvalidInput naming the key for anything else (garbage_collection_threshold is refused: it needs
// a memory fraction, which the predictor does not model).
AllocatorConfig parse_alloc_conf(const std::string& text);

struct AllocatorStats {
  std::size_t allocated = 0;  // live blocks' sizes (torch.cuda.memory_allocated)
  std::size_t reserved = 0;   // segments (torch.cuda.memory_reserved)
  std::size_t peak_allocated = 0;
  std::size_t peak_reserved = 0;
  std::size_t requested = 0;  // live requests before rounding
  std::size_t num_allocs = 0;
  std::size_t num_segments = 0;  // live
  std::size_t num_small_segments = 0;  // live, in the small pool (the rest are large)
  std::size_t num_device_mallocs = 0;  // cudaMalloc calls (or page maps with expandable segments)
  std::size_t num_device_frees = 0;
  std::size_t num_alloc_retries = 0;   // mallocs that had to release cached memory first
  std::size_t num_ooms = 0;
};

// A live allocation's handle.
using BlockId = std::uint64_t;
inline constexpr BlockId kNullBlock = 0;  // malloc(0): no block, as PyTorch returns nullptr

// What malloc did, for the caller's breakdown and the tracer comparison.
struct MallocResult {
  BlockId id = kNullBlock;  // kNullBlock with oom set, or for a 0-byte request
  bool oom = false;
  std::size_t block_size = 0;  // bytes counted as allocated
};

class CachingAllocator {
 public:
  // `device_limit`: the bytes cudaMalloc may hand out in total (the GPU's memory less the CUDA
  // context and everything outside the allocator).
  explicit CachingAllocator(std::size_t device_limit, AllocatorConfig config = {});

  static std::size_t round_size(std::size_t bytes, const AllocatorConfig& c);
  static std::size_t allocation_size(std::size_t rounded);

  MallocResult malloc(std::size_t bytes);
  void free(BlockId id);
  void empty_cache();
  void reset_peak_stats();
  const AllocatorStats& stats() const { return stats_; }
  std::size_t device_limit() const { return limit_; }
  std::size_t block_size(BlockId id) const;
  // For replaying a recorded run: the next segment cudaMalloc'd gets the recorded run's base
  // address instead of the replica's (once; an address already in use is ignored).
  void place_next_segment_at(std::uint64_t addr) { placed_addr_ = addr; }

  // The segments as (size, bytes in live blocks), in address order: the memory snapshot.
  std::vector<std::pair<std::size_t, std::size_t>> segments() const;

 private:
  struct Block {
    std::uint64_t addr = 0;
    std::size_t size = 0;
    std::uint64_t segment = 0;  // the segment's base address
    bool small = false;
    bool allocated = false;
    bool mapped = true;  // expandable segments: false for the unmapped tail
    std::size_t requested = 0;
  };
  struct Segment {
    std::uint64_t base = 0;
    std::size_t size = 0;  // mapped bytes
    bool small = false;
    bool expandable = false;
  };
  using FreeSet = std::set<std::pair<std::size_t, std::uint64_t>>;  // (size, addr)

  FreeSet& pool(bool small) { return small ? free_small_ : free_large_; }
  bool get_free_block(bool small, std::size_t size, std::uint64_t& out);
  bool alloc_segment(bool small, std::size_t size, std::uint64_t& out);
  bool alloc_expandable(bool small, std::size_t size, std::uint64_t& out);
  bool release_available_cached_blocks(std::size_t size);
  void release_cached_blocks();
  void release_segment(std::uint64_t base);
  void insert_free(const Block& b) { pool(b.small).insert({b.size, b.addr}); }
  void erase_free(const Block& b) { pool(b.small).erase({b.size, b.addr}); }
  Block* prev_of(const Block& b);
  Block* next_of(const Block& b);
  void update_peaks();

  std::size_t limit_;
  AllocatorConfig config_;
  std::map<std::uint64_t, Block> blocks_;     // by address: neighbours are map neighbours
  std::map<std::uint64_t, Segment> segments_;  // by base
  FreeSet free_small_, free_large_;
  std::map<BlockId, std::uint64_t> live_;
  BlockId next_id_ = 1;
  std::uint64_t next_addr_ = std::uint64_t{1} << 40;  // expandable segments' ranges, upwards
  std::uint64_t low_addr_ = std::uint64_t{1} << 52;   // alloc_segment's: the lowest base so far
  std::uint64_t placed_addr_ = 0;  // place_next_segment_at's, 0: none
  AllocatorStats stats_;
};

}  // namespace scalelab::predict
