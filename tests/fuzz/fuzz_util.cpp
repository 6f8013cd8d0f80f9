#include "fuzz_util.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "megatrain/core/error.h"

namespace mt::fuzz {

namespace {

struct Scratch {
  std::string dir;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/megatrain-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::perror("megatrain fuzz: mkdtemp");
      std::abort();
    }
    dir = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static Scratch s;  // destroyed at exit, which libFuzzer reaches through exit() after -max_total_time/-runs
  return s.dir;
}

std::string write_scratch(const std::string& name, const void* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  if (!f) {
    std::fprintf(stderr, "megatrain fuzz: cannot write %s\n", path.c_str());
    std::abort();  // the harness's own failure, not the input's: stop rather than report nonsense
  }
  return path;
}

std::vector<std::string_view> split_input(std::string_view input, std::string_view marker, size_t parts) {
  const std::string sep = "\n" + std::string(marker) + "\n";
  std::vector<std::string_view> out;
  while (out.size() + 1 < parts) {
    const size_t at = input.find(sep);
    if (at == std::string_view::npos) break;
    out.push_back(input.substr(0, at + 1));  // each piece keeps its final newline
    input.remove_prefix(at + sep.size());
  }
  out.push_back(input);
  out.resize(parts);
  return out;
}

void rejected(const char* what) {
  static const bool verbose = std::getenv("MT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", what);
}

void invariant_failed(const char* expr, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "\nmegatrain fuzz: invariant broken at %s:%d: %s\n  %s\n", file, line, expr, detail.c_str());
  std::abort();
}

}  // namespace mt::fuzz
