#pragma once
// The device-memory allocator: every byte of device memory goes through one of these.
//
// It has a capacity (the real device's memory, or what --device-memory says, so an 80 GB GPU can
// be emulated on a CPU), caches freed blocks for reuse like PyTorch's caching allocator, and keeps
// allocated / reserved / peak statistics (the analogues of torch.cuda.max_memory_allocated and
// max_memory_reserved). A request that does not fit throws OutOfMemory, never crashes.
//
// Sizes are rounded up to kRoundBytes. "allocated" counts rounded live requests; "reserved" counts
// blocks obtained from the backend (live or cached). A cached block is reused for a request of at
// most its size if it wastes no more than a quarter of it; otherwise a new block is reserved.
// When reserving would exceed the capacity, all cached blocks are released first and it retries.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace scalelab {

enum class DeviceType : std::uint8_t { kCPU, kCUDA };
std::string device_type_name(DeviceType d);

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

// Physical memory of this host in bytes (the CPU device's default capacity).
std::size_t host_physical_memory();

// One allocator event, recorded when tracing is on (tests compare the memory plan with it).
struct AllocEvent {
  bool alloc;               // false: a free
  std::size_t bytes;        // rounded request
  std::string what;         // label given to allocate(), empty if none
};

class DeviceAllocator {
 public:
  static constexpr std::size_t kRoundBytes = 512;

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
  DeviceType device() const { return backend_->device(); }

  static std::size_t round_size(std::size_t bytes) {
    return (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes;
  }

 private:
  void release_cached_locked();

  std::unique_ptr<MemoryBackend> backend_;
  std::size_t capacity_;
  mutable std::mutex mu_;
  struct Live {
    std::size_t block_bytes;    // size of the backend block
    std::size_t request_bytes;  // rounded request counted in `allocated`
  };
  std::unordered_map<void*, Live> live_;
  std::multimap<std::size_t, void*> cached_;  // block size -> block
  MemoryStats stats_;
  std::vector<AllocEvent>* trace_ = nullptr;
};

// Human-readable byte counts: "1.50 GiB", "512 B".
std::string format_bytes(std::size_t bytes);
// Parses "80GiB", "64GB", "512MiB", "1.5G", "123456" (bytes). GB = 1e9, GiB = 2^30; a bare G means GiB.
// Throws InvalidInput naming `what`.
std::size_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace scalelab
