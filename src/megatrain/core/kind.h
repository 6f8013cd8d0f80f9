// Closed sets spelt as strings. A setting with a few allowed values (a norm, an optimizer, a device, a resume mode) is
// an enum inside megatrain and a word outside it (TOML, the command line, checkpoint manifests, metrics). Each enum
// has one array of spellings in its enum's order; kind_name and parse_kind, written per enum with the helpers here,
// are the only places a word turns into a kind or back. So the code branches on enums, a misspelt word is refused
// where it is read (naming the setting and every allowed spelling), and no comparison with a string literal can
// quietly take a typo for another value.
#pragma once
#include <array>
#include <cstddef>
#include <string>

#include "megatrain/core/error.h"

namespace mt {

// names[k], for a kind k of an enum whose values are 0..N-1 in the array's order.
template <typename Kind, size_t N>
const char* kind_name_of(const std::array<const char*, N>& names, Kind k) {
  const auto i = static_cast<size_t>(k);
  MT_CHECK(i < N, "invalid kind value {}", i);  // only a cast from a bad integer gets here
  return names[i];
}

// "'a', 'b' or 'c'": the allowed spellings, for messages and the settings table.
template <size_t N>
std::string kind_spellings(const std::array<const char*, N>& names) {
  std::string allowed;
  for (size_t i = 0; i < N; ++i) allowed += fmt::format("{}'{}'", i == 0 ? "" : i + 1 == N ? " or " : ", ", names[i]);
  return allowed;
}

// out = the kind spelt `value`; else throws "<key> must be 'a', 'b' or 'c' (got '<value>')".
template <typename Kind, size_t N>
void parse_kind_of(const std::array<const char*, N>& names, const std::string& key, const std::string& value,
                   Kind& out) {
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i]) {
      out = static_cast<Kind>(i);
      return;
    }
  }
  fail("{} must be {} (got '{}')", key, kind_spellings(names), value);
}

// An enum joins by declaring, beside it, `const std::array<const char*, N>& kind_names(Kind)` (its spellings, found
// by argument-dependent lookup); these three then work for it.
template <typename Kind>
requires requires(Kind k) { kind_names(k); }
const char* kind_name(Kind k) { return kind_name_of(kind_names(k), k); }
template <typename Kind>
requires requires(Kind k) { kind_names(k); }
std::string kind_spellings(Kind k) { return kind_spellings(kind_names(k)); }
template <typename Kind>
requires requires(Kind k) { kind_names(k); }
void parse_kind(const std::string& key, const std::string& value, Kind& out) {
  parse_kind_of(kind_names(out), key, value, out);
}

}  // namespace mt
