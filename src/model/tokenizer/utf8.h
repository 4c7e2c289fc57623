#pragma once
// UTF-8 helpers of the byte-level BPE tokenizer.
#include <cstdint>
#include <string>
#include <string_view>

namespace scalelab::tok {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF).
bool is_valid_utf8(std::string_view s);

// `s` with every ill-formed subsequence replaced by U+FFFD the way Python's
// bytes.decode("utf-8", errors="replace") does it (one U+FFFD per maximal subpart, the Unicode
// "best practice"), which is how text with invalid bytes reaches Hugging Face `tokenizers`
// (it takes Python str). Valid input is returned unchanged.
std::string sanitize_utf8(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (< 0x110000) to `out`.
void append_utf8(std::string& out, std::uint32_t cp);

// Decodes the code point starting at s[i] (valid UTF-8 assumed) and advances i past it.
std::uint32_t next_code_point(std::string_view s, std::size_t& i);

// GPT-2's byte-to-unicode table (the byte-level alphabet): printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in order. byte_to_char(b) is its code point;
// char_to_byte(cp) is the byte of a code point of the alphabet, or -1.
std::uint32_t byte_to_char(std::uint8_t b);
int char_to_byte(std::uint32_t cp);

// A token string of a byte-level vocabulary (alphabet characters) as the raw bytes it stands
// for. Characters outside the alphabet pass through as their UTF-8 bytes, as the ByteLevel
// decoder of `tokenizers` does. `all_mapped` (optional) tells whether every character was in
// the alphabet.
std::string byte_level_to_bytes(std::string_view token, bool* all_mapped = nullptr);

// Raw bytes as byte-level alphabet characters (UTF-8).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace scalelab::tok
