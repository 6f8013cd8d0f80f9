// Files and folders of a test: reading a whole file, the folder a test keeps its files in, and a scratch folder
// removed when it goes out of scope.
#pragma once
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

namespace mt::test {

// The whole of a file ("" when it cannot be read: the log of a run that never started, a /proc file of a process
// that ended).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
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

// `temp_root()/name`, removed first so a run starts from nothing (not created: a run makes its own out_dir).
inline std::string fresh_dir(const std::string& name) {
  std::string d = temp_root() + name;
  std::filesystem::remove_all(d);
  return d;
}

// `temp_root()/<prefix><the running case's name>`, emptied and created: a fixture's folder for one case, kept for
// a look when the case fails (the fixture decides).
inline std::filesystem::path case_dir(const std::string& prefix) {
  const std::filesystem::path d = std::filesystem::path(temp_root()) /
                                  (prefix + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A fresh, empty folder of its own, removed with its contents when it goes out of scope: under the build tree,
// `test-scratch/<Suite.Case>-XXXXXX` (mkdtemp: unique among the test processes ctest runs at once, the same case
// under two BLAS kernels included). Ranks forked by a test leave with _exit and never remove it.
struct ScratchDir {
  std::string path;

  ScratchDir() {
    namespace fs = std::filesystem;
    std::string name = "scratch";
    if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
      name = std::string(info->test_suite_name()) + "." + info->name();
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised names: Layouts/Planes.Case/0
    const fs::path root = fs::path(MT_BINARY_DIR) / "test-scratch";
    fs::create_directories(root);
    std::string tmpl = (root / (name + "-XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // path/rel
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
};

}  // namespace mt::test
