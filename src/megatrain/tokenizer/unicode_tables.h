// The three character classes of GPT-2's pre-tokenisation regex (\p{L}, \p{N}, \s), as JavaScript defines
// them. The ranges are generated from node's regex engine by scripts/gen_unicode_tables.js so that the
// tokenizer splits text exactly where the reference JS encoder does.
#pragma once
#include <cstdint>
#include <span>

namespace mt::unicode {

enum class CharClass : uint8_t { Other, Letter, Number, Space };

struct ClassRange {
  uint32_t lo, hi;  // inclusive
  CharClass cls;
};

std::span<const ClassRange> class_ranges();  // sorted, disjoint; code points outside every range are Other
const char* unicode_version();               // Unicode version of the node that generated the tables

// ASCII is looked up directly (most text); everything else by binary search over the ranges.
inline CharClass char_class(uint32_t cp) {
  if (cp < 128) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::Space;
    return CharClass::Other;
  }
  auto r = class_ranges();
  size_t lo = 0, hi = r.size();
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (r[mid].hi < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < r.size() && r[lo].lo <= cp ? r[lo].cls : CharClass::Other;
}

}  // namespace mt::unicode
