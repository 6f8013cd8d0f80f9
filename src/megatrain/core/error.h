// Errors: every failure the user can cause (bad config, bad file, bad layout) becomes an mt::Error whose
// message names the problem; the CLI prints it and exits non-zero. Programming errors use the same path.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace mt {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt

// MT_CHECK(cond, "format {}", args...): throws mt::Error with the message when cond is false.
#define MT_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::mt::fail(__VA_ARGS__);   \
  } while (0)
