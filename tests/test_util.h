// Helpers every test suite may use.
#pragma once
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// "step:loss_exact" of every train line of a metrics.jsonl: two runs are bit-identical when these are equal.
inline std::vector<std::string> step_losses(const std::string& metrics) {
  std::vector<std::string> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.push_back(std::to_string(j["step"].get<int>()) + ":" + j["loss_exact"].get<std::string>());
  }
  return out;
}

// Prepares the Brown corpus shards into `dir` with `megatrain prepare-data` once per build tree. ctest runs test cases
// as parallel processes, so the first one to get the lock prepares into a fresh folder and renames it into place;
// the others wait on the lock and find the finished folder (never a half-written one).
inline void prepare_brown_once(const std::string& megatrain_bin, const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::exists(dir + "/meta.json")) return;
  fs::create_directories(fs::path(dir).parent_path());
  const std::string lock_path = dir + ".lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  MT_CHECK(fd >= 0, "cannot open the lock file {}", lock_path);
  ::flock(fd, LOCK_EX);
  std::string error;
  if (!fs::exists(dir + "/meta.json")) {
    const std::string tmp = dir + ".partial";
    fs::remove_all(tmp);
    const std::string cmd = megatrain_bin + " prepare-data --preset brown --out " + tmp + " >/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      error = "failed: " + cmd;
    } else {
      fs::remove_all(dir);
      fs::rename(tmp, dir);
    }
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  MT_CHECK(error.empty(), "{}", error);
}

// The folder a test keeps its files in: gtest's TempDir(), or a subfolder of it per OPENBLAS_CORETYPE, so the same
// case run under two BLAS kernels at once (tests/CMakeLists.txt registers such variants) never shares a folder.
inline std::string temp_root() {
  std::string root = ::testing::TempDir();
  if (const char* core = std::getenv("OPENBLAS_CORETYPE"); core && *core) {
    root += std::string("coretype-") + core + "/";
    std::filesystem::create_directories(root);
  }
  return root;
}

}  // namespace mt::test
