#pragma once
// Text datasets for training (issue 13): a corpus of documents is tokenized with the model's
// tokenizer and turned into samples of seq_len + 1 tokens.
//
// Specs (DataOptions::spec, `scalelab train --data` / `--val-data`):
//   text:FILE[,OPTION...]          documents are blank-line-separated blocks of FILE (a line
//                                  holding only spaces/tabs/CR counts as blank); a file
//                                  without blank lines is one document
//   jsonl:FILE[:FIELD][,OPTION...] one document per JSON line, its string FIELD (default "text")
//   parquet:FILE[:COLUMN][,OPTION...] one document per row of a string COLUMN (default "text"),
//                                  read by a small python3 helper where pyarrow is importable
//                                  (otherwise an error that says how to convert to JSONL)
// Options: pad            one document per sample, padded; pad positions are masked out of
//                         the loss (targets -100), a longer document continues in the next sample
//          shuffle        seeded shuffling of the samples (reshuffled every epoch; --seed)
//          split=train|val  keep the train or the validation part of a seeded document split
//          val-fraction=F   the validation part's share of the documents (default 0.05)
//          no-eos         do not append EOS after each document
// Default packing is Hugging Face run_clm's group_texts: each document tokenized as
// tokenizer(text) does (BOS where the template adds one), EOS appended, everything
// concatenated and cut into blocks of seq_len + 1 tokens, the remainder dropped.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace scalelab {

struct DataOptions;
struct TextSourceOptions;
class DataSource;

struct TextSpec {
  enum class Kind { kText, kJsonl, kParquet } kind = Kind::kText;
  std::string path;
  std::string field = "text";  // jsonl, parquet
  bool pad = false, shuffle = false, eos = true;
  std::string split;           // "", "train" or "val"
  double val_fraction = 0.05;
  std::string spec;            // as given
};

// True for "text:...", "jsonl:..." and "parquet:..." specs.
bool is_text_spec(const std::string& spec);
// Throws InvalidInput naming the spec for an unknown option or a malformed value.
TextSpec parse_text_spec(const std::string& spec);

// A file's documents. Throws InvalidInput naming the file: unreadable, empty or all
// whitespace, a JSONL line that is not a JSON object, a missing or non-string field.
class Corpus {
 public:
  static Corpus read(const TextSpec& spec);
  // Plain text file, documents as blank-line blocks (used by `scalelab tokenize`).
  static Corpus read_text(const std::string& path);
  static Corpus read_jsonl(const std::string& path, const std::string& field);
  // A string column of a Parquet file through python3 + pyarrow (InvalidInput saying how to
  // convert the file when pyarrow is not importable).
  static Corpus read_parquet(const std::string& path, const std::string& column);
  std::size_t size() const { return docs_.size(); }
  std::string_view doc(std::size_t i) const { return docs_[i]; }
  const std::vector<std::string_view>& docs() const { return docs_; }
  std::uint64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }
  // Keeps only the documents at `keep` (ascending indices).
  void select(const std::vector<std::size_t>& keep);

 private:
  std::string path_;
  std::shared_ptr<std::string> content_;            // text: the file; docs_ view into it
  std::shared_ptr<std::vector<std::string>> owned_;  // jsonl: the decoded fields
  std::vector<std::string_view> docs_;
  std::uint64_t bytes_ = 0;
};

// Token ids of every document, concatenated, with offsets[d]..offsets[d+1] the d-th's.
struct TokenizedCorpus {
  std::vector<std::uint32_t> ids;
  std::vector<std::uint64_t> offsets{0};
  std::size_t documents() const { return offsets.size() - 1; }
};

struct TokenizeOptions {
  bool add_special_tokens = true;   // the tokenizer's template (BOS for Llama 3)
  std::optional<std::uint32_t> eos;  // appended after each document when set
  int threads = 0;                   // 0: all
  // Called now and then with (documents done, total, bytes done, total bytes).
  std::function<void(std::size_t, std::size_t, std::uint64_t, std::uint64_t)> progress;
};

// Tokenizes documents [0, n) in batches over threads; `sink` receives each batch in order.
void tokenize_corpus(const tok::Tokenizer& tok, const Corpus& corpus, const TokenizeOptions& o,
                     const std::function<void(const std::vector<std::vector<std::uint32_t>>&)>& sink);
TokenizedCorpus tokenize_corpus(const tok::Tokenizer& tok, const Corpus& corpus, const TokenizeOptions& o);

// run_clm's group_texts: the documents concatenated and cut into blocks of `block` tokens, the
// remainder dropped. Returns n_blocks * block ids.
std::vector<std::int32_t> pack_group_texts(const TokenizedCorpus& c, std::int64_t block);

// Padded samples: each document starts a new sample of `block` tokens (a longer one continues
// in the following samples); the last piece is filled with `pad_id`. tokens: n * block ids;
// real: 1 where a token is the document's, 0 for padding. A piece of one token (nothing to
// predict) is dropped.
struct PaddedSamples {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> real;
};
PaddedSamples pack_padded(const TokenizedCorpus& c, std::int64_t block, std::uint32_t pad_id);

// A seeded train/validation split of n documents: the indices of the validation part
// (max(1, round(fraction * n)) of them when n >= 2, none when n < 2), ascending.
std::vector<std::size_t> validation_documents(std::size_t n, double fraction, std::uint64_t seed);

// A seeded permutation of [0, n) (Fisher-Yates over splitmix64; the same on every platform).
std::vector<std::size_t> seeded_permutation(std::size_t n, std::uint64_t seed);

// The data source of a text:/jsonl: spec for `options` (the tokenizer: text.tokenizer, else
// the tokenizer.json of the text.model directory).
std::unique_ptr<DataSource> make_text_data_source(const DataOptions& options, const TextSourceOptions& text);

}  // namespace scalelab
