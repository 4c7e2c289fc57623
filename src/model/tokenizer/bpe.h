#pragma once
// The BPE model of a byte-level tokenizer, over raw bytes: the vocabulary's byte-level strings
// are converted to the bytes they stand for once at load time, so encoding never maps text
// into the byte-level alphabet. Merge order follows `tokenizers` (models/bpe/word.rs): the
// adjacent pair with the lowest merge rank is merged first, the leftmost among equal ranks.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace scalelab::tok {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using BytesToId = std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>>;

// Open-addressing map (a, b) -> (rank, merged id), the hot lookup of the merge loop.
class MergeTable {
 public:
  void build(const std::vector<std::uint64_t>& keys, const std::vector<std::uint64_t>& values);
  // (rank << 32 | merged id) of the pair, or kNone.
  std::uint64_t find(std::uint32_t a, std::uint32_t b) const {
    if (slots_.empty()) return kNone;
    const std::uint64_t key = (static_cast<std::uint64_t>(a) << 32) | b;
    std::size_t i = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == kEmpty) return kNone;
      i = (i + 1) & mask_;
    }
  }
  static constexpr std::uint64_t kNone = ~0ull;

 private:
  static constexpr std::uint64_t kEmpty = ~0ull;
  struct Slot {
    std::uint64_t key = kEmpty, value = kNone;
  };
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 64;
};

struct BpeModel {
  BytesToId vocab;                 // byte strings of the vocabulary -> id
  std::int32_t byte_id[256];       // id of each single byte, -1 if absent
  MergeTable merges;
  bool ignore_merges = false;      // a piece found whole in the vocabulary is one token
  std::int64_t unk_id = -1;        // emitted for a byte absent from the vocabulary (else it is dropped)
  bool fuse_unk = false;

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view piece, std::vector<std::uint32_t>& out) const;
  // The merge loop alone over initial symbol ids (exposed so tests can run both strategies):
  // `use_heap` picks the priority-queue strategy that long pieces use.
  void merge(std::vector<std::uint32_t>& symbols, bool use_heap) const;
};

}  // namespace scalelab::tok
