#pragma once
// The pre-tokenizer regexes of Hugging Face `tokenizers` (written for Oniguruma) run through
// PCRE2 in UTF + UCP mode, JIT-compiled where the platform has a JIT. PCRE2 and not
// std::regex: the patterns need Unicode properties (\p{L}, \p{N}), Unicode-aware \s and
// case folding, and negative lookahead; PCRE2 is the well-kept library that has all of them.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace scalelab::tok {

// GPT-2's pre-tokenizer pattern (the ByteLevel pre-tokenizer with use_regex = true).
extern const char* const kGpt2Pattern;

// A compiled pattern; thread-safe (each thread gets its own match data).
class SplitRegex {
 public:
  // Throws InvalidInput naming `origin` when the pattern does not compile.
  SplitRegex(std::string_view oniguruma_pattern, const std::string& origin);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Splits `text` (valid UTF-8) with the "Isolated" behaviour: every match and every gap
  // between matches becomes a piece, in order. Appends [begin, end) byte offsets to `out`.
  void split(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const;

  bool jit() const { return jit_; }

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// An Oniguruma pattern rewritten for PCRE2: \s and \S become explicit classes of the Unicode
// White_Space characters (what Oniguruma's \s matches in Unicode mode; PCRE2's UCP \s also
// matches U+180E). Exposed for tests.
std::string translate_pattern(std::string_view oniguruma_pattern);

// A literal string as a PCRE2 pattern.
std::string quote_pattern(std::string_view literal);

}  // namespace scalelab::tok
