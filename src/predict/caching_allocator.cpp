#include "predict/caching_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace scalelab::predict {

namespace {

std::size_t round_up(std::size_t x, std::size_t unit) { return (x + unit - 1) / unit * unit; }

// Pages an expandable segment maps at a time (PyTorch: the pool's segment size).
std::size_t page_size(bool small) { return small ? kSmallBuffer : kLargeBuffer; }

bool parse_size_t(const std::string& s, std::size_t& out) {
  if (s.empty() || s.size() > 12) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  out = static_cast<std::size_t>(std::strtoull(s.c_str(), nullptr, 10));
  return true;
}

}  // namespace

AllocatorConfig parse_alloc_conf(const std::string& text) {
  AllocatorConfig c;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto colon = item.find(':');
    if (colon == std::string::npos)
      throw InvalidInput("[predict] PYTORCH_CUDA_ALLOC_CONF entry '" + item + "' has no ':value' — write key:value");
    const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    std::size_t n = 0;
    if (key == "expandable_segments") {
      if (value != "True" && value != "False")
        throw InvalidInput("[predict] PYTORCH_CUDA_ALLOC_CONF expandable_segments:" + value + " — use True or False");
      c.expandable_segments = value == "True";
    } else if (key == "max_split_size_mb") {
      if (!parse_size_t(value, n) || n <= 20)
        throw InvalidInput("[predict] PYTORCH_CUDA_ALLOC_CONF max_split_size_mb:" + value +
                           " — PyTorch requires an integer above 20");
      c.max_split_size = n << 20;
    } else if (key == "max_non_split_rounding_mb") {
      if (!parse_size_t(value, n))
        throw InvalidInput("[predict] PYTORCH_CUDA_ALLOC_CONF max_non_split_rounding_mb:" + value + " — an integer");
      c.max_non_split_rounding_size = n << 20;
    } else if (key == "roundup_power2_divisions") {
      if (!parse_size_t(value, n) || n == 0 || (n & (n - 1)) != 0 || n > 64)
        throw InvalidInput("[predict] PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions:" + value +
                           " — a power of two up to 64 (the per-interval list form is not modelled)");
      c.roundup_power2_divisions = n;
    } else {
      throw InvalidInput("[predict] PYTORCH_CUDA_ALLOC_CONF key '" + key +
                         "' is not modelled — supported: expandable_segments, max_split_size_mb, "
                         "max_non_split_rounding_mb, roundup_power2_divisions");
    }
  }
  return c;
}

CachingAllocator::CachingAllocator(std::size_t device_limit, AllocatorConfig config)
    : limit_(device_limit), config_(config) {}

std::size_t CachingAllocator::round_size(std::size_t size, const AllocatorConfig& c) {
  if (size < kMinBlockSize) return kMinBlockSize;
  if (c.roundup_power2_divisions > 1 && size > kMinBlockSize) {
    // PyTorch's roundup_power2_next_division: the interval [2^k, 2^(k+1)) containing size is cut
    // into `divisions` steps; sizes round up to the next step (and to 512 B).
    std::size_t pow2 = 1;
    while (pow2 * 2 <= size) pow2 *= 2;
    if (pow2 == size) return size;
    const std::size_t step = pow2 / c.roundup_power2_divisions;
    if (step >= kMinBlockSize) return round_up(size, step);
  }
  return round_up(size, kMinBlockSize);
}

std::size_t CachingAllocator::allocation_size(std::size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

CachingAllocator::Block* CachingAllocator::prev_of(const Block& b) {
  auto it = blocks_.find(b.addr);
  if (it == blocks_.begin()) return nullptr;
  --it;
  return it->second.segment == b.segment ? &it->second : nullptr;
}

CachingAllocator::Block* CachingAllocator::next_of(const Block& b) {
  auto it = blocks_.find(b.addr);
  ++it;
  if (it == blocks_.end()) return nullptr;
  return it->second.segment == b.segment ? &it->second : nullptr;
}

void CachingAllocator::update_peaks() {
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
}

bool CachingAllocator::get_free_block(bool small, std::size_t size, std::uint64_t& out) {
  FreeSet& p = pool(small);
  auto it = p.lower_bound({size, 0});
  if (it == p.end()) return false;
  const std::size_t found = it->first;
  if (size < config_.max_split_size && found >= config_.max_split_size) return false;
  if (size >= config_.max_split_size && found >= size + config_.max_non_split_rounding_size) return false;
  out = it->second;
  p.erase(it);
  return true;
}

bool CachingAllocator::alloc_segment(bool small, std::size_t size, std::uint64_t& out) {
  const std::size_t bytes = allocation_size(size);
  if (stats_.reserved + bytes > limit_ || stats_.reserved + bytes < bytes) return false;
  Segment s;
  s.size = bytes;
  s.small = small;
  if (placed_addr_ != 0 && blocks_.count(placed_addr_) == 0) {
    s.base = placed_addr_;
  } else {
    low_addr_ -= round_up(bytes, kRoundLarge) + kRoundLarge;
    s.base = low_addr_;
  }
  placed_addr_ = 0;
  segments_[s.base] = s;
  Block b;
  b.addr = s.base;
  b.size = bytes;
  b.segment = s.base;
  b.small = small;
  blocks_[b.addr] = b;
  stats_.reserved += bytes;
  ++stats_.num_segments;
  if (small) ++stats_.num_small_segments;
  ++stats_.num_device_mallocs;
  update_peaks();
  out = b.addr;
  return true;
}

// One segment per pool that grows at its end. A request with no free mapped block that fits maps
// pages after the segment's last block (reusing it when it is free).
bool CachingAllocator::alloc_expandable(bool small, std::size_t size, std::uint64_t& out) {
  Segment* seg = nullptr;
  for (auto& [base, s] : segments_)
    if (s.expandable && s.small == small) seg = &s;
  const std::size_t page = page_size(small);
  if (seg == nullptr) {
    const std::size_t bytes = round_up(size, page);
    if (stats_.reserved + bytes > limit_) return false;
    Segment s;
    s.base = next_addr_;
    s.size = bytes;
    s.small = small;
    s.expandable = true;
    next_addr_ += std::uint64_t{1} << 40;  // the reserved virtual range
    segments_[s.base] = s;
    Block b;
    b.addr = s.base;
    b.size = bytes;
    b.segment = s.base;
    b.small = small;
    blocks_[b.addr] = b;
    stats_.reserved += bytes;
    ++stats_.num_segments;
    if (small) ++stats_.num_small_segments;
    stats_.num_device_mallocs += bytes / page;
    update_peaks();
    out = b.addr;
    return true;
  }
  // The segment's last block.
  auto last = blocks_.lower_bound(seg->base + seg->size);
  --last;
  Block& tail = last->second;
  const std::size_t have = tail.allocated ? 0 : tail.size;
  const std::size_t more = round_up(size - have, page);
  if (stats_.reserved + more > limit_) return false;
  stats_.reserved += more;
  stats_.num_device_mallocs += more / page;
  update_peaks();
  if (!tail.allocated) {
    erase_free(tail);
    tail.size += more;
    seg->size += more;
    out = tail.addr;
  } else {
    Block b;
    b.addr = seg->base + seg->size;
    b.size = more;
    b.segment = seg->base;
    b.small = small;
    seg->size += more;
    blocks_[b.addr] = b;
    out = b.addr;
  }
  return true;
}

void CachingAllocator::release_segment(std::uint64_t base) {
  auto sit = segments_.find(base);
  const Segment s = sit->second;
  auto bit = blocks_.find(base);
  erase_free(bit->second);
  blocks_.erase(bit);
  segments_.erase(sit);
  stats_.reserved -= s.size;
  --stats_.num_segments;
  if (s.small) --stats_.num_small_segments;
  ++stats_.num_device_frees;
}

// PyTorch's release_available_cached_blocks: only with max_split_size set. Frees the smallest
// cached whole segment of at least max(size, max_split_size); failing that, the largest
// oversize ones until `size` bytes are freed.
bool CachingAllocator::release_available_cached_blocks(std::size_t size) {
  if (config_.max_split_size == kNoLimit) return false;
  FreeSet& p = free_large_;
  const std::size_t key = std::max(size, config_.max_split_size);
  auto whole = [&](std::uint64_t addr) {
    const Block& b = blocks_.at(addr);
    const Segment& s = segments_.at(b.segment);
    return !s.expandable && b.addr == s.base && b.size == s.size;
  };
  for (auto it = p.lower_bound({key, 0}); it != p.end(); ++it) {
    if (whole(it->second)) {
      release_segment(it->second);
      return true;
    }
  }
  // No single one: release the largest oversize ones, as they come, until enough are gone (PyTorch
  // releases them even when the total stays short, and then reports failure).
  std::size_t freed = 0;
  while (freed < key) {
    auto it = p.rbegin();
    while (it != p.rend() && !whole(it->second)) ++it;
    if (it == p.rend() || it->first < config_.max_split_size) break;
    freed += it->first;
    release_segment(it->second);
  }
  return freed >= key;
}

// empty_cache: every free block that is a whole segment goes back; expandable segments unmap
// their free tail pages.
void CachingAllocator::release_cached_blocks() {
  std::vector<std::uint64_t> bases;
  for (auto& [base, s] : segments_) {
    if (s.expandable) continue;
    const Block& b = blocks_.at(base);
    if (!b.allocated && b.size == s.size) bases.push_back(base);
  }
  for (auto base : bases) release_segment(base);
  for (auto it = segments_.begin(); it != segments_.end();) {
    Segment& s = it->second;
    if (!s.expandable) {
      ++it;
      continue;
    }
    auto last = blocks_.lower_bound(s.base + s.size);
    --last;
    Block& tail = last->second;
    if (tail.allocated) {
      ++it;
      continue;
    }
    const std::size_t page = page_size(s.small);
    // Only whole pages past the last live byte unmap (the tail block starts at a page boundary
    // or within one).
    const std::uint64_t keep_end = round_up(tail.addr - s.base, page);
    const std::size_t unmap = s.size - keep_end;
    if (unmap == 0) {
      ++it;
      continue;
    }
    erase_free(tail);
    stats_.reserved -= unmap;
    stats_.num_device_frees += unmap / page;
    s.size -= unmap;
    if (s.size == 0) {
      blocks_.erase(last);
      --stats_.num_segments;
      if (s.small) --stats_.num_small_segments;
      it = segments_.erase(it);
      continue;
    }
    tail.size -= unmap;
    if (tail.size == 0) {
      blocks_.erase(last);
    } else {
      insert_free(tail);
    }
    ++it;
  }
}

MallocResult CachingAllocator::malloc(std::size_t bytes) {
  MallocResult r;
  if (bytes == 0) return r;
  const std::size_t size = round_size(bytes, config_);
  const bool small = size <= kSmallSize;
  std::uint64_t addr = 0;
  bool found = get_free_block(small, size, addr);
  if (!found) {
    auto try_alloc = [&] {
      return config_.expandable_segments ? alloc_expandable(small, size, addr) : alloc_segment(small, size, addr);
    };
    found = try_alloc();
    if (!found) {
      ++stats_.num_alloc_retries;
      found = (release_available_cached_blocks(size) && try_alloc());
      if (!found) {
        release_cached_blocks();
        found = try_alloc();
      }
    }
  }
  if (!found) {
    ++stats_.num_ooms;
    r.oom = true;
    return r;
  }
  Block& b = blocks_.at(addr);
  const std::size_t remaining = b.size - size;
  const bool split = (small || config_.expandable_segments) ? remaining >= kMinBlockSize
                                                             : (size < config_.max_split_size && remaining > kSmallSize);
  if (split) {
    Block rest;
    rest.addr = b.addr + size;
    rest.size = remaining;
    rest.segment = b.segment;
    rest.small = b.small;
    b.size = size;
    blocks_[rest.addr] = rest;
    insert_free(rest);
  }
  Block& blk = blocks_.at(addr);
  blk.allocated = true;
  blk.requested = bytes;
  stats_.allocated += blk.size;
  stats_.requested += bytes;
  ++stats_.num_allocs;
  update_peaks();
  r.id = next_id_++;
  r.block_size = blk.size;
  live_[r.id] = addr;
  return r;
}

void CachingAllocator::free(BlockId id) {
  if (id == kNullBlock) return;
  auto lit = live_.find(id);
  if (lit == live_.end()) throw RuntimeError("[predict] free of an unknown block id " + std::to_string(id));
  const std::uint64_t addr = lit->second;
  live_.erase(lit);
  Block* b = &blocks_.at(addr);
  stats_.allocated -= b->size;
  stats_.requested -= b->requested;
  b->allocated = false;
  b->requested = 0;
  // Merge with the next block, then the previous one (each only when free).
  if (Block* n = next_of(*b); n != nullptr && !n->allocated) {
    erase_free(*n);
    b->size += n->size;
    blocks_.erase(n->addr);
  }
  if (Block* p = prev_of(*b); p != nullptr && !p->allocated) {
    erase_free(*p);
    p->size += b->size;
    blocks_.erase(b->addr);
    b = p;
  }
  insert_free(*b);
}

void CachingAllocator::empty_cache() { release_cached_blocks(); }

void CachingAllocator::reset_peak_stats() {
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

std::size_t CachingAllocator::block_size(BlockId id) const {
  auto it = live_.find(id);
  return it == live_.end() ? 0 : blocks_.at(it->second).size;
}

std::vector<std::pair<std::size_t, std::size_t>> CachingAllocator::segments() const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (const auto& [base, s] : segments_) {
    std::size_t live = 0;
    for (auto it = blocks_.lower_bound(base); it != blocks_.end() && it->second.segment == base; ++it)
      if (it->second.allocated) live += it->second.size;
    out.push_back({s.size, live});
  }
  return out;
}

}  // namespace scalelab::predict
