// Learns a GPT-2 style byte-level BPE vocabulary from text and writes it in GPT-2's file formats
// (encoder.json + vocab.bpe), so Tokenizer::load_gpt2 and the reference JS encoder can both load it.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt {

struct BpeVocab {
  // Raw bytes of each token, index = id: the 256 bytes in GPT-2's order (gpt2_byte_order()), then the merge
  // results in rank order, then "<|endoftext|>" last.
  std::vector<std::string> tokens;
  std::vector<std::pair<int32_t, int32_t>> merges;  // (left id, right id), rank order
};

struct BpeTrainOptions {
  int64_t min_pair_count = 2;  // stop early (smaller vocabulary) once the best pair is rarer than this
};

// Pre-tokenises like the tokenizer ("<|endoftext|>" in a text separates documents and is never merged),
// then repeatedly merges the most frequent adjacent pair (ties: smallest left id, then right id) until the
// vocabulary, "<|endoftext|>" included, has vocab_size tokens or no pair is frequent enough.
// A merge whose result already exists as a token (reachable by two merge paths) adds a rule but no token.
BpeVocab train_bpe(const std::vector<std::string>& texts, int vocab_size, const BpeTrainOptions& opt = {});

std::string gpt2_encoder_json(const BpeVocab& v);  // exactly as GPT-2's encoder.json (Python json.dumps)
std::string gpt2_vocab_bpe(const BpeVocab& v);     // "#version: 0.2\n" then "left right\n" per merge
void write_gpt2_vocab(const BpeVocab& v, const std::string& dir);  // dir/encoder.json, dir/vocab.bpe

}  // namespace mt
