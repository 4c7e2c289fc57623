#include "core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace scalelab {

namespace {

class HostBackend final : public MemoryBackend {
 public:
  static constexpr std::size_t kMmapThreshold = 256 * 1024;

  void* raw_alloc(std::size_t bytes) override {
    if (bytes >= kMmapThreshold) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : p;
    }
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) return nullptr;
    return p;
  }
  void raw_free(void* p, std::size_t bytes) override {
    if (bytes >= kMmapThreshold) {
      munmap(p, bytes);
    } else {
      std::free(p);
    }
  }
  DeviceType device() const override { return DeviceType::kCPU; }
};

// Hands out distinct fake addresses (page-aligned, with a guard page between segments) and never
// touches memory: the real allocator's caching policy runs over them unchanged.
class MetaBackend final : public MemoryBackend {
 public:
  void* raw_alloc(std::size_t bytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + 4095) / 4096 * 4096 + 4096;
    return p;
  }
  void raw_free(void*, std::size_t) override {}
  DeviceType device() const override { return DeviceType::kMeta; }

 private:
  std::uintptr_t next_ = 0x100000;
};

}  // namespace

namespace {
thread_local const char* tls_region = nullptr;
}  // namespace

AllocRegion::AllocRegion(const char* name) : prev_(tls_region) { tls_region = name; }
AllocRegion::~AllocRegion() { tls_region = prev_; }
const char* AllocRegion::current() { return tls_region; }
void AllocRegion::set(const char* name) { tls_region = name; }

std::unique_ptr<MemoryBackend> make_host_backend() { return std::make_unique<HostBackend>(); }
std::unique_ptr<MemoryBackend> make_meta_backend() { return std::make_unique<MetaBackend>(); }

std::size_t host_physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::size_t{1} << 34;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
}

DeviceAllocator::DeviceAllocator(std::unique_ptr<MemoryBackend> backend, std::size_t capacity)
    : backend_(std::move(backend)), capacity_(capacity) {
  stats_.capacity = capacity;
}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Every segment goes back, live blocks included (a leak of the caller's; the process stays
  // clean). Every block is either live or free.
  std::set<Block*> all;
  for (auto& [p, b] : live_) all.insert(b);
  for (auto& [size, b] : free_small_) all.insert(b);
  for (auto& [size, b] : free_large_) all.insert(b);
  for (Block* b : all) delete b;
  live_.clear();
  free_small_.clear();
  free_large_.clear();
  for (auto& seg : segments_) backend_->raw_free(seg->base, seg->size);
  segments_.clear();
}

void DeviceAllocator::set_capacity(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = bytes;
  stats_.capacity = bytes;
}

void DeviceAllocator::set_trace(std::vector<AllocEvent>* sink) {
  std::lock_guard<std::mutex> lock(mu_);
  trace_ = sink;
}

void DeviceAllocator::set_usage_observer(UsageObserver fn, void* user) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = fn;
  observer_user_ = user;
}

void* DeviceAllocator::allocate(std::size_t bytes, const char* what) {
  const std::size_t req = round_size(std::max<std::size_t>(bytes, 1));
  const bool small = req <= kSmallRequest;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.num_allocations;

  // Best fit among the free blocks of the pool.
  Block* b = nullptr;
  FreeSet& free_set = pool(small);
  auto it = free_set.lower_bound({req, nullptr});
  if (it != free_set.end()) {
    b = it->second;
    free_set.erase(it);
  } else {
    // A new segment: 2 MiB for the small pool, 20 MiB for a mid-size request (shared by the next
    // ones), else the request rounded up to 2 MiB; under a capacity too tight for that (an emulated
    // small device), the request rounded to 2 MiB, then just the request.
    const std::size_t rounded = (req + kSegmentBytes - 1) / kSegmentBytes * kSegmentBytes;
    std::size_t seg_bytes = small ? kSegmentBytes : req < kMidRequest ? kMidSegmentBytes : rounded;
    if (stats_.reserved + seg_bytes > capacity_) {
      if (release_cached_locked()) ++stats_.num_cache_flushes;
      if (stats_.reserved + seg_bytes > capacity_) seg_bytes = std::min(seg_bytes, rounded);
      if (stats_.reserved + seg_bytes > capacity_) seg_bytes = req;
    }
    void* p = nullptr;
    if (stats_.reserved + seg_bytes <= capacity_) p = backend_->raw_alloc(seg_bytes);
    if (p == nullptr) {
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "[allocator] out of %s memory%s%s: tried to allocate %s with %s allocated and %s "
                    "reserved of a %s capacity — lower --micro-batch-size or --seq-len, enable memory "
                    "savers (--attn flash, --fused-kernels, --activation-checkpointing), or raise "
                    "--device-memory",
                    device_type_name(backend_->device()).c_str(), what ? " for " : "", what ? what : "",
                    format_bytes(req).c_str(), format_bytes(stats_.allocated).c_str(),
                    format_bytes(stats_.reserved).c_str(), format_bytes(capacity_).c_str());
      throw OutOfMemory(buf, req, stats_.allocated, stats_.reserved, capacity_);
    }
    ++stats_.num_backend_allocations;
    auto seg = std::make_unique<Segment>();
    seg->base = static_cast<char*>(p);
    seg->size = seg_bytes;
    seg->small = small;
    b = new Block{seg->base, seg_bytes, true, nullptr, nullptr, seg.get()};
    segments_.push_back(std::move(seg));
    stats_.reserved += seg_bytes;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  }
  // Split off the rest when it can serve another request of this pool.
  const std::size_t rest = b->size - req;
  if (rest >= (small ? kRoundBytes : kSmallRequest)) {
    Block* r = new Block{b->ptr + req, rest, true, b, b->next, b->segment};
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = req;
    insert_free(r);
  }
  b->free = false;
  live_[b->ptr] = b;
  stats_.allocated += b->size;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  if (trace_) {
    const char* region = AllocRegion::current();
    trace_->push_back({true, req, what ? what : "", b->ptr, bytes, stats_.reserved, stats_.allocated,
                       region ? region : ""});
  }
  if (observer_) observer_(observer_user_, stats_.allocated, stats_.reserved);
  return b->ptr;
}

void DeviceAllocator::deallocate(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours (or double free): ignore rather than corrupt stats
  Block* b = it->second;
  live_.erase(it);
  stats_.allocated -= b->size;
  if (trace_) trace_->push_back({false, b->size, "", b->ptr, 0, stats_.reserved, stats_.allocated, ""});
  if (observer_) observer_(observer_user_, stats_.allocated, stats_.reserved);
  b->free = true;
  // Merge with free neighbours of the same segment.
  if (b->prev && b->prev->free) {
    Block* prev = b->prev;
    erase_free(prev);
    prev->size += b->size;
    prev->next = b->next;
    if (b->next) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (b->next && b->next->free) {
    Block* next = b->next;
    erase_free(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    delete next;
  }
  insert_free(b);
}

bool DeviceAllocator::release_cached_locked() {
  // A segment is entirely free when its one block spans it.
  bool released = false;
  for (auto seg = segments_.begin(); seg != segments_.end();) {
    Segment* s = seg->get();
    FreeSet& free_set = pool(s->small);
    auto it = std::find_if(free_set.begin(), free_set.end(), [s](const std::pair<std::size_t, Block*>& e) {
      return e.second->segment == s && e.second->size == s->size;
    });
    if (it == free_set.end()) {
      ++seg;
      continue;
    }
    Block* b = it->second;
    free_set.erase(it);
    delete b;
    backend_->raw_free(s->base, s->size);
    stats_.reserved -= s->size;
    seg = segments_.erase(seg);
    released = true;
  }
  return released;
}

void DeviceAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

MemoryStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DeviceAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

std::string format_bytes(std::size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1u << 30));
  } else if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1u << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  }
  return buf;
}

std::size_t parse_bytes(const std::string& text, const std::string& what) {
  auto bad = [&]() {
    return InvalidInput("[" + what + "] cannot read '" + text +
                        "' as a size — write e.g. 80GiB, 64GB, 512MiB or a byte count");
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw bad();
  double value = 0;
  try {
    value = std::stod(text.substr(0, i));
  } catch (...) {
    throw bad();
  }
  std::string unit = text.substr(i);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "t" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "tb") mult = 1e12;
  else throw bad();
  const double bytes = value * mult;
  if (!(bytes > 0) || !std::isfinite(bytes)) {
    throw InvalidInput("[" + what + "] size must be positive, got '" + text + "'");
  }
  return static_cast<std::size_t>(std::llround(bytes));
}

}  // namespace scalelab
