#pragma once
// The device-memory allocator: every byte of device memory goes through one of these.
//
// It has a capacity (the real device's memory, or what --device-memory says, so an 80 GB GPU can
// be emulated on a CPU), caches freed blocks for reuse like PyTorch's caching allocator, and keeps
// allocated / reserved / peak statistics (the analogues of torch.cuda.max_memory_allocated and
// max_memory_reserved). A request that does not fit throws OutOfMemory, never crashes.
//
// The caching works as PyTorch's CUDA caching allocator does: memory comes from the backend in
// segments; a segment is cut into blocks; a request takes the best-fitting free block (rounded to
// kRoundBytes) and splits off the rest when it is large enough to serve another request; a freed
// block merges with free neighbours of its segment. Requests up to kSmallRequest come from 2 MiB
// segments of their own pool; mid-size ones (up to kMidRequest) from kMidSegmentBytes (20 MiB)
// segments of the large pool that several of them share, as PyTorch's kLargeBuffer (a 1.1 MiB
// activation given a 2 MiB segment of its own would leave 0.9 MiB no other request can use: 2.7
// MiB per layer of SmolLM2 at 512 tokens); larger ones from segments of their size rounded up to
// 2 MiB. Small tensors never pin a large segment. "allocated" counts the bytes of live blocks;
// "reserved" counts segments. When a new segment would exceed the capacity, every segment that is
// entirely free is released first and it retries; only then does it fail.
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device.h"

namespace scalelab {


struct MemoryStats {
  std::size_t capacity = 0;
  std::size_t allocated = 0;       // live rounded requests
  std::size_t reserved = 0;        // obtained from the backend (live + cached)
  std::size_t peak_allocated = 0;
  std::size_t peak_reserved = 0;
  std::size_t num_allocations = 0; // calls to allocate()
  std::size_t num_backend_allocations = 0;
  std::size_t num_cache_flushes = 0;
};

// Where raw blocks come from: host memory for the CPU device, cudaMalloc for CUDA.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual void* raw_alloc(std::size_t bytes) = 0;  // nullptr on failure
  virtual void raw_free(void* p, std::size_t bytes) = 0;
  virtual DeviceType device() const = 0;
};

// Host memory: 64-byte aligned; large blocks are mmap'ed so that releasing them returns the pages.
std::unique_ptr<MemoryBackend> make_host_backend();
// No memory: distinct, never-touched fake addresses (the meta device; the memory plan).
std::unique_ptr<MemoryBackend> make_meta_backend();

// Physical memory of this host in bytes (the CPU device's default capacity).
std::size_t host_physical_memory();

// One allocator event, recorded when tracing is on (the memory plan measures a step with it).
struct AllocEvent {
  bool alloc;               // false: a free
  std::size_t bytes;        // rounded request (the block's size)
  std::string what;         // label given to allocate(), empty if none (and for frees)
  const void* ptr = nullptr;      // the block
  std::size_t requested = 0;      // the request before rounding (allocations)
  std::size_t reserved = 0;       // the allocator's reserved bytes after the event
  std::size_t allocated = 0;      // the allocator's allocated bytes after the event
  std::string region;             // the AllocRegion in force on the allocating thread, if any
};

// Names the part of a training step that allocations made on this thread belong to while it
// lives ("activations", "backward temporaries", "recomputed layer", ...): the memory plan's
// categories come from these regions and from the allocations' own labels. Regions nest; the
// innermost wins. Costs a thread-local pointer swap; nothing is recorded unless tracing is on.
class AllocRegion {
 public:
  explicit AllocRegion(const char* name);
  ~AllocRegion();
  AllocRegion(const AllocRegion&) = delete;
  AllocRegion& operator=(const AllocRegion&) = delete;
  static const char* current();  // nullptr outside any region
  // Moves this (innermost) region on to the next part of the step.
  void set(const char* name);

 private:
  const char* prev_;
};

class DeviceAllocator {
 public:
  static constexpr std::size_t kRoundBytes = 512;
  static constexpr std::size_t kSmallRequest = std::size_t{1} << 20;  // up to 1 MiB: the small pool
  static constexpr std::size_t kSegmentBytes = std::size_t{2} << 20;  // 2 MiB segments / rounding
  static constexpr std::size_t kMidRequest = std::size_t{10} << 20;      // below 10 MiB: shared segments
  static constexpr std::size_t kMidSegmentBytes = std::size_t{20} << 20; // of 20 MiB (PyTorch's kLargeBuffer)

  DeviceAllocator(std::unique_ptr<MemoryBackend> backend, std::size_t capacity);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // Returns a block of at least `bytes` (64-byte aligned). Throws OutOfMemory when the capacity
  // cannot hold it; the message names the request, the usage, and `what` when given.
  void* allocate(std::size_t bytes, const char* what = nullptr);
  void deallocate(void* p);

  MemoryStats stats() const;
  void reset_peaks();
  void empty_cache();  // returns cached (free) blocks to the backend
  std::size_t capacity() const { return capacity_; }
  void set_capacity(std::size_t bytes);
  // Records every allocate/deallocate into `sink` until called with nullptr.
  void set_trace(std::vector<AllocEvent>* sink);
  // Called under the allocator's lock after every allocation and free with the allocated and
  // reserved bytes that follow it (the timeline's memory counter); fn null: none. The observer must
  // not call back into this allocator.
  using UsageObserver = void (*)(void* user, std::size_t allocated, std::size_t reserved);
  void set_usage_observer(UsageObserver fn, void* user);
  DeviceType device() const { return backend_->device(); }

  static std::size_t round_size(std::size_t bytes) {
    return (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
  }

 private:
  bool release_cached_locked();  // true when a segment was released

  std::unique_ptr<MemoryBackend> backend_;
  std::size_t capacity_;
  mutable std::mutex mu_;
  UsageObserver observer_ = nullptr;
  void* observer_user_ = nullptr;
  struct Segment;
  struct Block {
    char* ptr = nullptr;
    std::size_t size = 0;
    bool free = true;
    Block* prev = nullptr;  // neighbours within the segment, by address
    Block* next = nullptr;
    Segment* segment = nullptr;
  };
  struct Segment {
    char* base = nullptr;
    std::size_t size = 0;
    bool small = false;
  };
  // Free blocks by (size, address): the best fit is the first not smaller than a request. Blocks
  // are heap nodes owned by the allocator: created when a segment is reserved or a block split,
  // deleted when merged into a neighbour or when their segment is released.
  using FreeSet = std::set<std::pair<std::size_t, Block*>>;
  FreeSet& pool(bool small) { return small ? free_small_ : free_large_; }
  void insert_free(Block* b) { pool(b->segment->small).insert({b->size, b}); }
  void erase_free(Block* b) { pool(b->segment->small).erase({b->size, b}); }

  std::unordered_map<void*, Block*> live_;
  std::vector<std::unique_ptr<Segment>> segments_;
  FreeSet free_small_, free_large_;
  MemoryStats stats_;
  std::vector<AllocEvent>* trace_ = nullptr;
};

// Human-readable byte counts: "1.50 GiB", "512 B".
std::string format_bytes(std::size_t bytes);
// Parses "80GiB", "64GB", "512MiB", "1.5G", "123456" (bytes). GB = 1e9, GiB = 2^30; a bare G means GiB.
// Throws InvalidInput naming `what`.
std::size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace scalelab
