// What every fuzz target shares: a private scratch directory for APIs that take paths, a way to cut one input into
// several files, and the one rule of a target: an mt::Error is the parser rejecting bad input (the expected outcome
// for most inputs); anything else — a crash, a sanitizer report, an uncaught exception, a leak, a timeout, or a
// broken FUZZ_CHECK invariant — is a finding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::fuzz {

// A directory of this process's own (under $TMPDIR, else /tmp), created on first use and removed at exit: parallel
// runs of the same target (libFuzzer -jobs, ctest -j) never share files.
const std::string& scratch_dir();
// Writes bytes to scratch_dir()/name (truncating it) and returns the path.
std::string write_scratch(const std::string& name, const void* data, size_t size);
inline std::string write_scratch(const std::string& name, std::string_view s) {
  return write_scratch(name, s.data(), s.size());
}

// Cuts an input into up to `parts` pieces at each line that is exactly `marker` ("\n<marker>\n" between pieces), so
// seed inputs of several files stay readable text; missing pieces are empty. The last piece keeps any later markers.
std::vector<std::string_view> split_input(std::string_view input, std::string_view marker, size_t parts);

// Aborts (a finding libFuzzer reports with the input) when an invariant the accepted input must satisfy is broken:
// the parser accepted data it then serves wrongly.
[[noreturn]] void invariant_failed(const char* expr, const char* file, int line, const std::string& detail);

// The store secret of the tcp_store_protocol target's server: its seeds authenticate with it (seed_corpus.cpp).
inline constexpr const char* kStoreSecret = "fuzz-store-secret-0123456789abcdef";

// Called with each rejection's message; prints it when MT_FUZZ_VERBOSE is set (to see why an input is refused).
void rejected(const char* what);

}  // namespace mt::fuzz

#define FUZZ_CHECK(cond, detail)                                                  \
  do {                                                                            \
    if (!(cond)) ::mt::fuzz::invariant_failed(#cond, __FILE__, __LINE__, detail); \
  } while (0)

// The body of LLVMFuzzerTestOneInput: runs the statements and treats mt::Error (a clear rejection) as success.
#define FUZZ_ACCEPT_MT_ERRORS(...)    \
  do {                                \
    try {                             \
      __VA_ARGS__                     \
    } catch (const ::mt::Error& e) {  \
      ::mt::fuzz::rejected(e.what()); \
    }                                 \
  } while (0)
