#include "train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "train/text_data.h"

namespace scalelab {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class SyntheticData final : public DataSource {
 public:
  explicit SyntheticData(const DataOptions& o)
      : o_(o), range_(static_cast<std::uint32_t>(std::min<std::int64_t>(1000, o.vocab_size))) {}
  void next(Batch& b) override {
    const std::int64_t S = o_.seq_len;
    auto* in = b.inputs.data<std::int32_t>();
    auto* tg = b.targets.data<std::int32_t>();
    for (std::int64_t i = 0; i < o_.micro_batch; ++i) {
      const std::uint64_t sample = static_cast<std::uint64_t>((micro_ * o_.world + o_.rank) * o_.micro_batch + i);
      for (std::int64_t p = 0; p <= S; ++p) {
        const auto t = static_cast<std::int32_t>(synthetic_token(o_.seed, sample, static_cast<std::uint64_t>(p), range_));
        if (p < S) in[i * S + p] = t;
        if (p > 0) tg[i * S + p - 1] = t;
      }
    }
    ++micro_;
  }
  void skip(std::int64_t micro_batches, Batch&) override { micro_ += micro_batches; }  // index-based
  std::string describe() const override {
    return "synthetic (uniform ids in [0, " + std::to_string(range_) + "), seed " + std::to_string(o_.seed) + ")";
  }

 private:
  DataOptions o_;
  std::uint32_t range_;
  std::int64_t micro_ = 0;
};

class TokenFileData final : public DataSource {
 public:
  explicit TokenFileData(const DataOptions& o) : o_(o) {
    const std::string& path = o.spec;
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) {
      throw InvalidInput("[data] cannot open token file '" + path + "': " + std::strerror(errno) +
                         " — --data takes 'synthetic', a path to a uint32 token file (scalelab tokenize writes one), "
                         "text:FILE or jsonl:FILE:FIELD");
    }
    struct stat st {};
    ::fstat(fd_, &st);
    bytes_ = static_cast<std::size_t>(st.st_size);
    if (bytes_ == 0) {
      ::close(fd_);
      throw InvalidInput("[data] token file '" + path + "' is empty — write uint32 token ids into it");
    }
    if (bytes_ % 4 != 0) {
      ::close(fd_);
      throw InvalidInput("[data] token file '" + path + "' has " + std::to_string(bytes_) +
                         " bytes, not a multiple of 4 — it must hold little-endian uint32 token ids");
    }
    n_tokens_ = static_cast<std::int64_t>(bytes_ / 4);
    if (n_tokens_ < o.seq_len + 1) {
      ::close(fd_);
      throw InvalidInput("[data] token file '" + path + "' holds " + std::to_string(n_tokens_) +
                         " tokens, fewer than one sample of seq-len+1 = " + std::to_string(o.seq_len + 1) +
                         " — use a longer file or a shorter --seq-len");
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      ::close(fd_);
      throw InvalidInput("[data] cannot map token file '" + path + "': " + std::strerror(errno));
    }
    tokens_ = static_cast<const std::uint32_t*>(p);
    for (std::int64_t i = 0; i < n_tokens_; ++i) {
      if (tokens_[i] >= static_cast<std::uint64_t>(o.vocab_size)) {
        const std::uint32_t bad = tokens_[i];
        close_map();
        throw InvalidInput("[data] token file '" + path + "': token " + std::to_string(bad) + " at index " +
                           std::to_string(i) + " is >= the model's vocab_size " + std::to_string(o.vocab_size) +
                           " — the file was made for another tokenizer or model");
      }
    }
    n_samples_ = n_tokens_ / (o.seq_len + 1);
  }
  ~TokenFileData() override { close_map(); }

  void next(Batch& b) override {
    const std::int64_t S = o_.seq_len;
    auto* in = b.inputs.data<std::int32_t>();
    auto* tg = b.targets.data<std::int32_t>();
    for (std::int64_t i = 0; i < o_.micro_batch; ++i) {
      const std::int64_t sample = ((micro_ * o_.world + o_.rank) * o_.micro_batch + i) % n_samples_;
      const std::uint32_t* src = tokens_ + sample * (S + 1);
      for (std::int64_t p = 0; p < S; ++p) {
        in[i * S + p] = static_cast<std::int32_t>(src[p]);
        tg[i * S + p] = static_cast<std::int32_t>(src[p + 1]);
      }
    }
    ++micro_;
  }
  void skip(std::int64_t micro_batches, Batch&) override { micro_ += micro_batches; }  // index-based
  std::string describe() const override {
    return o_.spec + " (" + std::to_string(n_tokens_) + " tokens, " + std::to_string(n_samples_) + " samples)";
  }
  std::int64_t num_samples() const override { return n_samples_; }

 private:
  void close_map() {
    if (tokens_) ::munmap(const_cast<std::uint32_t*>(tokens_), bytes_);
    if (fd_ >= 0) ::close(fd_);
    tokens_ = nullptr;
    fd_ = -1;
  }
  DataOptions o_;
  int fd_ = -1;
  std::size_t bytes_ = 0;
  const std::uint32_t* tokens_ = nullptr;
  std::int64_t n_tokens_ = 0, n_samples_ = 0, micro_ = 0;
};

}  // namespace

std::uint32_t synthetic_token(std::uint64_t seed, std::uint64_t sample, std::uint64_t pos, std::uint32_t range) {
  const std::uint64_t h = splitmix64(splitmix64(seed * 0x100000001b3ull + sample) ^ pos);
  // Multiply-shift maps 32 random bits to [0, range) with negligible bias for small ranges.
  return static_cast<std::uint32_t>(((h >> 32) * static_cast<std::uint64_t>(range)) >> 32);
}

std::unique_ptr<DataSource> make_data_source(const DataOptions& o, const TextSourceOptions& text) {
  if (o.spec == "synthetic") return std::make_unique<SyntheticData>(o);
  if (is_text_spec(o.spec)) return make_text_data_source(o, text);
  return std::make_unique<TokenFileData>(o);
}

Batch make_batch(std::int64_t micro_batch, std::int64_t seq_len, DeviceAllocator& alloc) {
  Batch b;
  b.batch = micro_batch;
  b.seq = seq_len;
  b.inputs = Tensor::empty({micro_batch, seq_len}, DType::kI32, alloc, "batch inputs");
  b.targets = Tensor::empty({micro_batch, seq_len}, DType::kI32, alloc, "batch targets");
  return b;
}

}  // namespace scalelab
