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

std::string device_type_name(DeviceType d) { return d == DeviceType::kCPU ? "cpu" : "cuda"; }

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

}  // namespace

std::unique_ptr<MemoryBackend> make_host_backend() { return std::make_unique<HostBackend>(); }

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
  release_cached_locked();
  // Live blocks at destruction are a leak of the caller's; free them so the process stays clean.
  for (auto& [p, live] : live_) backend_->raw_free(p, live.block_bytes);
  live_.clear();
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

void* DeviceAllocator::allocate(std::size_t bytes, const char* what) {
  const std::size_t req = round_size(std::max<std::size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.num_allocations;
  if (trace_) trace_->push_back({true, req, what ? what : ""});

  // Best fit among cached blocks, accepted if it wastes at most a quarter of the block.
  auto it = cached_.lower_bound(req);
  if (it != cached_.end() && it->first - req <= it->first / 4) {
    void* p = it->second;
    const std::size_t block = it->first;
    cached_.erase(it);
    live_[p] = Live{block, req};
    stats_.allocated += req;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }

  if (stats_.reserved + req > capacity_ && !cached_.empty()) {
    release_cached_locked();
    ++stats_.num_cache_flushes;
  }
  void* p = nullptr;
  if (stats_.reserved + req <= capacity_) p = backend_->raw_alloc(req);
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
  live_[p] = Live{req, req};
  stats_.reserved += req;
  stats_.allocated += req;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  return p;
}

void DeviceAllocator::deallocate(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // not ours (or double free): ignore rather than corrupt stats
  if (trace_) trace_->push_back({false, it->second.request_bytes, ""});
  stats_.allocated -= it->second.request_bytes;
  cached_.emplace(it->second.block_bytes, p);
  live_.erase(it);
}

void DeviceAllocator::release_cached_locked() {
  for (auto& [size, p] : cached_) {
    backend_->raw_free(p, size);
    stats_.reserved -= size;
  }
  cached_.clear();
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
