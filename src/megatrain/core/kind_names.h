// Enums spelt as strings: the one pattern behind every parse_kind/kind_name pair (model/config.h's kinds, the
// checkpoint events' stage and why). A kind's spellings are an array in the enum's order; kind_name_of turns a kind
// into its spelling, parse_kind_of a spelling into a kind, refusing any other spelling with an error that names the
// key and every allowed spelling. Code then branches on enums, so a misspelt kind cannot compile.
#pragma once
#include <array>
#include <cstddef>
#include <string>

#include <fmt/format.h>

#include "megatrain/core/error.h"

namespace mt {

template <typename Kind, size_t N>
const char* kind_name_of(const std::array<const char*, N>& names, Kind k) {
  const auto i = static_cast<size_t>(k);
  MT_CHECK(i < N, "invalid kind value {}", i);  // only a cast from a bad integer gets here
  return names[i];
}

// out = the kind spelt `value`; throws mt::Error "<key> must be 'a' or 'b' (got '<value>')" for any other spelling.
template <typename Kind, size_t N>
void parse_kind_of(const std::array<const char*, N>& names, const std::string& key, const std::string& value,
                   Kind& out) {
  std::string allowed;
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i]) {
      out = static_cast<Kind>(i);
      return;
    }
    allowed += fmt::format("{}'{}'", i == 0 ? "" : i + 1 == N ? " or " : ", ", names[i]);
  }
  fail("{} must be {} (got '{}')", key, allowed, value);
}

}  // namespace mt
