// The tokenizer files an HF model directory carries, written beside an exported model (`convert --to-hf`) so that
// transformers' AutoTokenizer loads the model's own tokenizer from it.
#pragma once
#include <string>
#include <vector>

namespace mt {

// Writes into out_dir the files of the tokenizer at `path` (what Tokenizer::load reads) in the names HF reads:
//   - an HF tokenizer.json: copied, with the tokenizer_config.json and special_tokens_map.json beside it if any;
//   - GPT-2's encoder.json + vocab.bpe: written as vocab.json + merges.txt (the same formats under HF's names).
// Throws, writing nothing, unless the tokenizer loads and has at most vocab_size tokens (the model's rows): a
// larger one is another model's. Returns the files written.
std::vector<std::string> write_hf_tokenizer_files(const std::string& path, const std::string& out_dir, int vocab_size);
// The check write_hf_tokenizer_files makes first, alone: throws unless the tokenizer at `path` loads and has at
// most vocab_size tokens (an export calls it before writing the model, so a wrong tokenizer leaves nothing behind).
void check_tokenizer_of_model(const std::string& path, int vocab_size);

}  // namespace mt
