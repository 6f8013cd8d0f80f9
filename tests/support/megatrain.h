// The built `megatrain` binary that the end-to-end tests run, and the Brown shards they train on: prepared once per
// build tree by `megatrain prepare-data` (test_util.h, prepare_brown_once).
#pragma once
#include <sys/wait.h>

#include <string>

#include "test_util.h"

namespace mt::test {

// build/megatrain (tests/CMakeLists.txt: mt_test(... BINARY) builds it before the test). Joined by the preprocessor:
// GCC 12 at -O1 warns falsely (-Warray-bounds) on an inlined std::string + of a literal to a temporary.
inline const std::string kMegatrain = MT_BINARY_DIR "/megatrain";

// The Brown shards in GPT-2's vocabulary (50,257 tokens): the tests of the trainer itself. The multi-process tests
// train on kSmallBrown (test_util.h says why).
inline const std::string kGpt2Brown = MT_BINARY_DIR "/test-data/brown";

// A wait status (std::system's, waitpid's) as an exit code: the process's own, or 128 + the signal that ended it.
inline int shell_exit_code(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

inline void prepare_gpt2_brown() { prepare_brown_once(kMegatrain, kGpt2Brown); }
inline void prepare_small_brown() { prepare_brown_once(kMegatrain, kSmallBrown, kSmallVocab); }

}  // namespace mt::test
