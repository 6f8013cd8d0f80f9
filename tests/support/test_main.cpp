// Every test executable's main: gtest's, with one change. ::testing::TempDir(), where the tests put their runs'
// folders (/tmp/ by default), becomes <build>/test-tmp/ unless TEST_TMPDIR is set: two build trees testing on one
// machine at once (two checkouts, CI beside a developer) would otherwise share /tmp/mt_stop_sigterm and the like,
// and remove each other's files mid-run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

int main(int argc, char** argv) {
  const char* set = std::getenv("TEST_TMPDIR");
  if (!set || !*set) {
    const std::string dir = std::string(MT_BINARY_DIR) + "/test-tmp";
    std::filesystem::create_directories(dir);
    ::setenv("TEST_TMPDIR", dir.c_str(), 1);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
