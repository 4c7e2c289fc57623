#include "model/tokenizer/bpe.h"

#include <queue>

namespace scalelab::tok {

void MergeTable::build(const std::vector<std::uint64_t>& keys, const std::vector<std::uint64_t>& values) {
  std::size_t cap = 16;
  while (cap < keys.size() * 2) cap *= 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64;
  for (std::size_t c = cap; c > 1; c >>= 1) --shift_;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    std::size_t i = static_cast<std::size_t>((keys[k] * 0x9E3779B97F4A7C15ull) >> shift_);
    while (slots_[i].key != kEmpty && slots_[i].key != keys[k]) i = (i + 1) & mask_;
    if (slots_[i].key == keys[k]) continue;  // a repeated merge keeps its first (lowest) rank
    slots_[i] = Slot{keys[k], values[k]};
  }
}

namespace {

constexpr std::size_t kHeapThreshold = 48;

void merge_quadratic(const MergeTable& merges, std::vector<std::uint32_t>& s) {
  // Ranks of the adjacent pairs; each merge rescans (pieces are short: words).
  std::vector<std::uint64_t> rank(s.size() > 1 ? s.size() - 1 : 0);
  for (std::size_t i = 0; i + 1 < s.size(); ++i) rank[i] = merges.find(s[i], s[i + 1]);
  while (!rank.empty()) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < rank.size(); ++i) {
      if ((rank[i] >> 32) < (rank[best] >> 32)) best = i;
    }
    if (rank[best] == MergeTable::kNone) break;
    s[best] = static_cast<std::uint32_t>(rank[best]);
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(best));
    if (best > 0) rank[best - 1] = merges.find(s[best - 1], s[best]);
    if (best < rank.size()) rank[best] = merges.find(s[best], s[best + 1]);
  }
}

void merge_heap(const MergeTable& merges, std::vector<std::uint32_t>& s) {
  const std::size_t n = s.size();
  std::vector<std::int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<std::int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
  }
  struct Cand {
    std::uint32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
  auto push = [&](std::size_t i) {
    if (next[i] < 0) return;
    const std::uint64_t r = merges.find(s[i], s[static_cast<std::size_t>(next[i])]);
    if (r != MergeTable::kNone) {
      q.push(Cand{static_cast<std::uint32_t>(r >> 32), static_cast<std::uint32_t>(i), s[i], s[static_cast<std::size_t>(next[i])]});
    }
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    const std::size_t i = c.pos;
    if (!alive[i] || next[i] < 0) continue;
    const auto j = static_cast<std::size_t>(next[i]);
    if (s[i] != c.left || s[j] != c.right) continue;  // stale: a neighbour changed since
    s[i] = static_cast<std::uint32_t>(merges.find(c.left, c.right));
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[static_cast<std::size_t>(next[j])] = static_cast<std::int64_t>(i);
    if (prev[i] >= 0) push(static_cast<std::size_t>(prev[i]));
    push(i);
  }
  std::size_t w = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (alive[i]) s[w++] = s[i];
  }
  s.resize(w);
}

}  // namespace

void BpeModel::merge(std::vector<std::uint32_t>& symbols, bool use_heap) const {
  if (symbols.size() < 2) return;
  if (use_heap) {
    merge_heap(merges, symbols);
  } else {
    merge_quadratic(merges, symbols);
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<std::uint32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    const auto it = vocab.find(piece);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<std::uint32_t> sym;
  sym.clear();
  bool last_unk = false;
  for (char ch : piece) {
    const std::int32_t id = byte_id[static_cast<unsigned char>(ch)];
    if (id >= 0) {
      sym.push_back(static_cast<std::uint32_t>(id));
      last_unk = false;
    } else if (unk_id >= 0) {
      // An unknown symbol never merges; fuse_unk folds a run of them into one.
      if (!(fuse_unk && last_unk)) {
        merge(sym, sym.size() > kHeapThreshold);
        out.insert(out.end(), sym.begin(), sym.end());
        sym.clear();
        out.push_back(static_cast<std::uint32_t>(unk_id));
      }
      last_unk = true;
    }
  }
  merge(sym, sym.size() > kHeapThreshold);
  out.insert(out.end(), sym.begin(), sym.end());
}

}  // namespace scalelab::tok
