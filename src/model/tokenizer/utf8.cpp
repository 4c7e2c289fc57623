#include "model/tokenizer/utf8.h"

#include <array>

namespace scalelab::tok {

namespace {

// Length of the well-formed prefix of a UTF-8 sequence starting at s[i] (1..4), or 0 with
// `bad` set to the length of its maximal ill-formed subpart (>= 1). Table 3-7 of the Unicode
// standard: the second byte's range depends on the lead byte.
std::size_t sequence_length(std::string_view s, std::size_t i, std::size_t& bad) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      bad = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      bad = k;
      return 0;
    }
  }
  return need + 1;
}

struct ByteTables {
  std::array<std::uint32_t, 256> to_char{};
  std::array<int, 324> to_byte{};  // code points < 0x144
  ByteTables() {
    to_byte.fill(-1);
    std::uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<std::uint32_t>(b) : 256 + extra++;
      to_byte[to_char[b]] = b;
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t bad = 0;
    const std::size_t n = sequence_length(s, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  for (std::size_t i = 0; i < s.size();) {
    std::size_t bad = 0;
    const std::size_t n = sequence_length(s, i, bad);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::uint32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  std::uint32_t cp = b0 & (0x3F >> n);
  ++i;
  for (int k = 0; k < n && i < s.size(); ++k, ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
  return cp;
}

std::uint32_t byte_to_char(std::uint8_t b) { return tables().to_char[b]; }

int char_to_byte(std::uint32_t cp) { return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1; }

std::string byte_level_to_bytes(std::string_view token, bool* all_mapped) {
  std::string out;
  out.reserve(token.size());
  bool mapped = true;
  for (std::size_t i = 0; i < token.size();) {
    const std::size_t start = i;
    const std::uint32_t cp = next_code_point(token, i);
    const int b = char_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      mapped = false;
      out.append(token.data() + start, i - start);
    }
  }
  if (all_mapped) *all_mapped = mapped;
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_char(static_cast<std::uint8_t>(c)));
  return out;
}

}  // namespace scalelab::tok
