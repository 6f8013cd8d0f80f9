// Shared by the ckpt tests: a scratch directory per test, raw file edits, manifests edited field by field, and
// error-message matching.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/core/error.h"
#include "files.h"

namespace ckpt_test {

namespace fs = std::filesystem;

// A fresh directory under the build tree, removed when the test ends (files.h).
using mt::test::ScratchDir;

inline std::vector<uint8_t> read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void write_text(const std::string& p, const std::string& s) {
  write_bytes(p, std::vector<uint8_t>(s.begin(), s.end()));
}

// Writes an edited manifest into checkpoint dir re-sealed (a valid manifest_checksum): what such a test exercises
// is the validation of the manifest's fields, which runs after the checksum is verified.
inline void write_sealed_manifest(const std::string& dir, const nlohmann::json& m) {
  write_text(dir + "/manifest.json", mt::seal_manifest(m).dump());
}

// A manifest's fields as JSON pointers: every leaf, and every object or array holding one.
inline std::set<std::string> manifest_fields(const nlohmann::json& manifest) {
  std::set<std::string> fields;
  const nlohmann::json flat = manifest.flatten();  // named: items() of a temporary would dangle
  for (auto& [path, value] : flat.items())
    for (nlohmann::json::json_pointer ptr(path); !ptr.empty(); ptr = ptr.parent_pointer())
      fields.insert(ptr.to_string());
  return fields;
}

// A value of each JSON type (and sign), to put where a manifest field's value belongs.
inline std::vector<nlohmann::json> wrong_typed_values() {
  using nlohmann::json;
  return {json(7), json(-3), json(2.5), json("x"), json(nullptr), json::array(), json::object(), json(true)};
}

// Opens the checkpoint at dir the two ways a reader does (CheckpointReader::open, Checkpoint::load) and returns how
// many refused it. A refusal must be an mt::Error naming dir; any other exception is a test failure. `what` names
// the edit made to the manifest, for the failure messages.
inline int refusals_naming_dir(const std::string& dir, const std::string& what) {
  int refused = 0;
  for (int how = 0; how < 2; ++how) {
    try {
      if (how == 0)
        mt::CheckpointReader::open(dir);
      else
        mt::Checkpoint::load(dir);
    } catch (const mt::Error& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << what << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": not an mt::Error: " << e.what();
    }
  }
  return refused;
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
#define EXPECT_ERROR_HAS(stmt, ...)                                                            \
  do {                                                                                         \
    std::string msg_ = ::ckpt_test::error_of([&] { stmt; });                                   \
    for (const char* s_ : {__VA_ARGS__})                                                       \
      EXPECT_NE(msg_.find(s_), std::string::npos) << "message: " << msg_ << "\nlacks: " << s_; \
  } while (0)
