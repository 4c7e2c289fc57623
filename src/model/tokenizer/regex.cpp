#include "model/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace scalelab::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space (PropList.txt), the set Oniguruma's \s matches on UTF-8 text.
constexpr const char* kWhiteSpace = R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

struct MatchData {
  pcre2_match_data* md = nullptr;
  ~MatchData() {
    if (md) pcre2_match_data_free(md);
  }
};

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  int class_depth = 0;  // inside [...]
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += class_depth > 0 ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && class_depth == 0) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

std::string quote_pattern(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

SplitRegex::SplitRegex(std::string_view pattern, const std::string& origin) {
  const std::string translated = translate_pattern(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw InvalidInput("[tokenizer] " + origin + ": the pre-tokenizer regex '" + std::string(pattern) +
                       "' does not compile with PCRE2 (" + reinterpret_cast<const char*>(msg) + " at offset " +
                       std::to_string(offset) + ") — only patterns PCRE2 understands are supported");
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::~SplitRegex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void SplitRegex::split(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // One match data per thread: only the whole match's offsets are read, so one pair is enough
  // for any pattern (a pattern with groups then returns 0, "ovector too small", and a match).
  thread_local MatchData tl;
  if (!tl.md) tl.md = pcre2_match_data_create(1, nullptr);
  pcre2_match_data* md = tl.md;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  std::size_t pos = 0, last = 0;
  while (pos <= n) {
    // The text was checked (sanitized) once before: no UTF check per call.
    int rc = jit_ ? pcre2_jit_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                  : pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    // The JIT's stack can run out where the interpreter (heap frames) still copes.
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_) rc = pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw InvalidInput("[tokenizer] the pre-tokenizer regex failed on a text of " + std::to_string(n) + " bytes (PCRE2: " +
                         reinterpret_cast<const char*>(msg) + ") — split the text into smaller documents");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t b = ov[0], e = ov[1];
    if (e == b) {
      // An empty match splits nothing; step one character and search again.
      if (b >= n) break;
      pos = b + 1;
      while (pos < n && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (b > last) out.emplace_back(last, b);
    out.emplace_back(b, e);
    last = pos = e;
  }
  if (last < n) out.emplace_back(last, n);
}

}  // namespace scalelab::tok
