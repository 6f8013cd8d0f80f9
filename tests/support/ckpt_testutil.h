// Shared by the ckpt tests: a scratch directory per test, raw file edits, and error-message matching.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/core/error.h"

namespace ckpt_test {

namespace fs = std::filesystem;

// A fresh directory under the build tree, removed when the test ends.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::path(MT_BINARY_DIR) / "ckpt_scratch" /
           (std::string(info->test_suite_name()) + "." + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

inline std::vector<uint8_t> read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void write_text(const std::string& p, const std::string& s) { write_bytes(p, std::vector<uint8_t>(s.begin(), s.end())); }

// Writes an edited manifest into checkpoint dir re-sealed (a valid manifest_checksum): what such a test exercises
// is the validation of the manifest's fields, which runs after the checksum is verified.
inline void write_sealed_manifest(const std::string& dir, const nlohmann::json& m) {
  write_text(dir + "/manifest.json", mt::seal_manifest(m).dump());
}

// Runs fn, expects an mt::Error, returns its message ("" and a test failure when nothing was thrown).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const mt::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an mt::Error";
  return "";
}

}  // namespace ckpt_test

// EXPECT_ERROR_HAS(statement, "substring", ...): the statement throws mt::Error whose message holds every substring.
#define EXPECT_ERROR_HAS(stmt, ...)                                                        \
  do {                                                                                     \
    std::string msg_ = ::ckpt_test::error_of([&] { stmt; });                               \
    for (const char* s_ : {__VA_ARGS__}) EXPECT_NE(msg_.find(s_), std::string::npos) << "message: " << msg_ << "\nlacks: " << s_; \
  } while (0)
