// Helpers every test suite may use.
#pragma once
#include <string>

#include "megatrain/core/error.h"

namespace mt::test {

// The message of the mt::Error that f() throws, or "<no error>" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace mt::test
