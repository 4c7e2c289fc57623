#pragma once
// A Hugging Face `tokenizer.json` with a byte-level BPE model (GPT-2, OPT, Llama 3 and the
// like), encoding and decoding exactly as the `tokenizers` library does:
//   added/special tokens are split out first (leftmost-longest, with their lstrip/rstrip),
//   the rest goes through the pre-tokenizers (ByteLevel with GPT-2's regex, or a Split regex
//   such as Llama 3's followed by ByteLevel without regex; PCRE2 runs the regexes), the BPE
//   model (ignore_merges honoured; merges as "a b" strings or [a, b] pairs), then the
//   TemplateProcessing post-processor adds BOS/EOS when add_special_tokens is true.
//   Decoding is byte-level: raw bytes back, byte for byte.
// Anything else (another model type, a normalizer, other pre-tokenizers) is refused at load
// time with InvalidInput naming the file. Text with invalid UTF-8 is read the way it reaches
// `tokenizers` from Python: each ill-formed subsequence becomes U+FFFD (see sanitize_utf8).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace scalelab::tok {

struct TokenizerImpl;

class Tokenizer {
 public:
  // Loads a tokenizer.json. Special-token roles (bos/eos/pad) come from a tokenizer_config.json
  // beside it when present (as transformers reads them), else from config.json's
  // bos/eos/pad_token_id, else from well-known names among the special tokens.
  // Throws InvalidInput naming `path` for anything unreadable or unsupported.
  static Tokenizer load(const std::string& path);
  // The same from the file's text (`origin` names it in errors); no neighbour files read.
  static Tokenizer from_json(std::string_view json, const std::string& origin);

  // Token ids of `text` (any bytes). add_special_tokens applies the post-processor template.
  std::vector<std::uint32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  void encode_append(std::string_view text, bool add_special_tokens, std::vector<std::uint32_t>& out) const;
  // Many texts at once over `threads` threads (0: OpenMP's default); results in input order.
  std::vector<std::vector<std::uint32_t>> encode_batch(const std::vector<std::string_view>& texts,
                                                       bool add_special_tokens, int threads = 0) const;

  // The bytes the ids stand for. skip_special_tokens drops special added tokens.
  // Throws InvalidInput for an id >= vocab_size() or one the vocabulary does not define.
  std::string decode(std::span<const std::uint32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest id (model vocabulary and added tokens).
  std::int64_t vocab_size() const;
  std::optional<std::uint32_t> token_to_id(std::string_view token) const;  // byte-level spelling
  bool is_special(std::uint32_t id) const;

  std::optional<std::uint32_t> bos_id() const;
  std::optional<std::uint32_t> eos_id() const;
  std::optional<std::uint32_t> pad_id() const;
  void set_eos_id(std::uint32_t id);

  const std::string& path() const;
  std::string describe() const;  // "PATH (byte-level BPE, V tokens, regex: gpt2|split, JIT)"

 private:
  std::shared_ptr<const TokenizerImpl> impl_;
  std::optional<std::uint32_t> bos_, eos_, pad_;
};

// The tokenizer of a model: `model` is a directory (its tokenizer.json, as transformers saves
// it beside config.json) or a tokenizer.json path. Throws InvalidInput with what to do when
// there is none.
Tokenizer find_tokenizer(const std::string& model);

}  // namespace scalelab::tok
