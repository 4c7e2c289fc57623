#pragma once
// Training data sources (DESIGN.md "Contracts"):
// - synthetic: the seeds' dummy dataset: each sample is seq_len+1 uniform random token ids in
//   [0, min(1000, vocab_size)); inputs are the first seq_len, targets the last seq_len. Sample g of
//   a seed is the same whichever rank or micro-batch reads it (counter-based generator).
// - a token file: flat little-endian uint32 ids read in order, sample after sample, each sample
//   seq_len+1 tokens; it wraps around at the end (next epoch). No shuffling.
// - text:FILE / jsonl:FILE:FIELD: documents tokenized with the model's tokenizer and packed as
//   Hugging Face run_clm does, or padded with masked pads (see train/text_data.h).
// Data-parallel ranks read disjoint samples: in each global micro-batch of world·B samples,
// rank r takes samples [r·B, (r+1)·B).
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "model/model.h"

namespace scalelab {

namespace tok {
class Tokenizer;
}

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Fills batch.inputs/targets (int32 [B, S]) with the next micro-batch for this rank.
  virtual void next(Batch& batch) = 0;
  virtual std::string describe() const = 0;
  // Samples in one pass over the data (a token file: tokens / (seq_len + 1)); 0 when endless or
  // unknown (synthetic). Evaluation over "the whole set" needs it.
  virtual std::int64_t num_samples() const { return 0; }
  // Moves past the next `micro_batches` micro-batches, as that many next() calls would (--resume
  // seeks to the checkpoint's data position). The default reads and drops them into `scratch`;
  // the built-in sources compute every sample from its index, so they only move the index.
  virtual void skip(std::int64_t micro_batches, Batch& scratch) {
    for (std::int64_t i = 0; i < micro_batches; ++i) next(scratch);
  }
};

struct DataOptions {
  std::string spec = "synthetic";  // "synthetic", a token file path, or a text:/jsonl: spec
  std::int64_t seq_len = 0;
  std::int64_t micro_batch = 0;
  std::int64_t vocab_size = 0;
  std::uint64_t seed = 0;
  int rank = 0;
  int world = 1;
};

// What text:/jsonl: specs need beyond DataOptions.
struct TextSourceOptions {
  std::string tokenizer;        // a tokenizer.json; empty: the one in the `model` directory
  std::string model;            // --model (a directory, when it holds the tokenizer)
  std::string flag = "--data";  // names the flag in error messages (--val-data reuses all this)
  // A tokenizer the caller already loaded (one tokenizer read for many files); when set, `tokenizer`
  // and `model` are not read again.
  std::shared_ptr<const tok::Tokenizer> loaded = nullptr;
};

// Throws InvalidInput for an unreadable, empty, short or malformed file, or ids >= vocab_size.
// text:/jsonl: specs are tokenized with text.tokenizer (or the model directory's).
std::unique_ptr<DataSource> make_data_source(const DataOptions& options, const TextSourceOptions& text = {});

// Allocates a batch's int32 tensors from `alloc`.
Batch make_batch(std::int64_t micro_batch, std::int64_t seq_len, DeviceAllocator& alloc);

// The counter-based generator of the synthetic dataset: token `pos` of sample `sample`.
std::uint32_t synthetic_token(std::uint64_t seed, std::uint64_t sample, std::uint64_t pos, std::uint32_t range);

}  // namespace scalelab
