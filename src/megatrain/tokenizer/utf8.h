// Strict UTF-8, as every tokenizer here reads text: a well-formed sequence is one character; anything else (an
// overlong form, a surrogate, a code point above U+10FFFF, a cut-off sequence, a stray continuation byte) is a
// single byte that starts no character. One decoder, so the byte-level pre-tokenizers and the SentencePiece-style
// character split agree on where characters are.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mt::utf8 {

struct Char {
  uint32_t len;  // 1..4 bytes; 1 as well for a byte that starts no character
  uint32_t cp;   // the code point; kNone for a byte that starts no character
};
inline constexpr uint32_t kNone = 0xFFFFFFFFu;

// The character at s[i] (i < n).
inline Char at(const unsigned char* s, size_t n, size_t i) {
  auto cont = [&](size_t k) { return k < n && (s[k] & 0xC0) == 0x80; };
  const unsigned char b = s[i];
  if (b < 0x80) return {1, b};
  constexpr Char bad{1, kNone};
  if (b < 0xC2 || b > 0xF4) return bad;
  if (b < 0xE0) return cont(i + 1) ? Char{2, (b & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu)} : bad;
  if (b < 0xF0) {
    if (!cont(i + 1) || !cont(i + 2)) return bad;
    if ((b == 0xE0 && s[i + 1] < 0xA0) || (b == 0xED && s[i + 1] > 0x9F)) return bad;
    return {3, (b & 0x0Fu) << 12 | (s[i + 1] & 0x3Fu) << 6 | (s[i + 2] & 0x3Fu)};
  }
  if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return bad;
  if ((b == 0xF0 && s[i + 1] < 0x90) || (b == 0xF4 && s[i + 1] > 0x8F)) return bad;
  return {4, (b & 0x07u) << 18 | (s[i + 1] & 0x3Fu) << 12 | (s[i + 2] & 0x3Fu) << 6 | (s[i + 3] & 0x3Fu)};
}

}  // namespace mt::utf8
