// Helpers shared by the data pipeline tests: small file writers (a scratch directory: files.h, ScratchDir).
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "files.h"
#include "megatrain/core/error.h"
#include "test_util.h"

namespace mt::testing {

using mt::test::error_of;

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// An llm.c shard built byte by byte (independent of ShardWriter): header ints, then tokens of 2 or 4 bytes.
inline std::string llmc_shard_bytes(std::vector<int32_t> header, const std::vector<uint32_t>& tokens, int token_bytes) {
  header.resize(256, 0);
  std::string out;
  auto put = [&](uint32_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  for (int32_t h : header) put(static_cast<uint32_t>(h), 4);
  for (uint32_t t : tokens) put(t, token_bytes);
  return out;
}

}  // namespace mt::testing
