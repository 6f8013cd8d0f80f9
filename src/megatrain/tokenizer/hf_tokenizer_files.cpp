#include "megatrain/tokenizer/hf_tokenizer_files.h"

#include <filesystem>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/tokenizer/tokenizer.h"

namespace mt {

void check_tokenizer_of_model(const std::string& path, int vocab_size) {
  const std::string missing = Tokenizer::missing_files(path);
  MT_CHECK(missing.empty(), "tokenizer {}: {}", path, missing);
  const Tokenizer tok = Tokenizer::load(path);  // the files must load, as the exported model will read them
  // Fewer is fine (a vocabulary padded to a multiple of 64, say: the extra rows are never read); more would give
  // ids the model has no rows for.
  MT_CHECK(tok.vocab_size() <= vocab_size,
           "tokenizer {} has {} tokens but the model has {}: it is not this model's "
           "tokenizer (pass the one its data was prepared with, or --tokenizer none)",
           path, tok.vocab_size(), vocab_size);
}

std::vector<std::string> write_hf_tokenizer_files(const std::string& path, const std::string& out_dir, int vocab_size) {
  namespace fs = std::filesystem;
  check_tokenizer_of_model(path, vocab_size);
  std::error_code ec;
  // (source, name in out_dir): what Tokenizer::load read, under the names transformers looks for.
  std::vector<std::pair<fs::path, std::string>> copies;
  const fs::path json = fs::is_regular_file(path, ec) ? fs::path(path) : fs::path(path) / "tokenizer.json";
  if (fs::is_regular_file(json, ec) && !fs::exists(fs::path(path) / "encoder.json", ec)) {
    copies.emplace_back(json, "tokenizer.json");
    for (const char* beside : {"tokenizer_config.json", "special_tokens_map.json"})
      if (fs::is_regular_file(json.parent_path() / beside, ec))
        copies.emplace_back(json.parent_path() / beside, beside);
  } else {
    copies.emplace_back(fs::path(path) / "encoder.json", "vocab.json");
    copies.emplace_back(fs::path(path) / "vocab.bpe", "merges.txt");
  }
  std::vector<std::string> written;
  fs::create_directories(out_dir, ec);
  for (const auto& [from, name] : copies) {
    const std::string to = (fs::path(out_dir) / name).string();
    write_file_atomic(to, read_text_file(from.string()));
    written.push_back(to);
  }
  return written;
}

}  // namespace mt
