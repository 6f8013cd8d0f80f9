#include "megatrain/tokenizer/bpe_train.h"

#include <algorithm>
#include <filesystem>
#include <queue>
#include <string_view>
#include <unordered_map>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/tokenizer/tokenizer.h"

namespace mt {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}
int32_t key_left(uint64_t k) { return static_cast<int32_t>(k >> 32); }
int32_t key_right(uint64_t k) { return static_cast<int32_t>(k & 0xFFFFFFFFu); }

struct Candidate {
  int64_t count;
  uint64_t pair;
  // Max-heap order: more frequent first, then the smaller (left, right).
  bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

// The unique pre-tokens of the texts as byte-token ids, with their frequencies; training works on these, never on
// the raw text again. A pre-token of one byte has no pairs and is left out.
struct BpeWords {
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
};

BpeWords bpe_words(const std::vector<std::string>& texts, const int32_t (&byte_id)[256]) {
  std::unordered_map<std::string_view, int64_t> freq_of;
  for (const std::string& text : texts) {
    std::string_view rest = text;
    while (!rest.empty()) {
      size_t f = rest.find(kEndOfText);
      pretokenize(rest.substr(0, f), [&](std::string_view piece) { ++freq_of[piece]; });
      rest = f == std::string_view::npos ? std::string_view{} : rest.substr(f + kEndOfText.size());
    }
  }
  BpeWords corpus;
  corpus.words.reserve(freq_of.size());
  for (auto& [piece, f] : freq_of) {
    if (piece.size() < 2) continue;  // no pairs: nothing to learn from it
    std::vector<int32_t> w(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) w[i] = byte_id[static_cast<uint8_t>(piece[i])];
    corpus.words.push_back(std::move(w));
    corpus.freq.push_back(f);
  }
  return corpus;
}

// Adjacent pairs of the words: how often each occurs, which words hold it, and the heap the next merge comes from.
struct BpePairs {
  std::unordered_map<uint64_t, int64_t> count;               // pair -> occurrences (weighted by word frequency)
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words that contain (or once contained) it
  std::priority_queue<Candidate> heap;                       // may hold stale counts: check against count
};

BpePairs bpe_pairs(const BpeWords& corpus) {
  BpePairs pairs;
  for (int32_t w = 0; w < static_cast<int32_t>(corpus.words.size()); ++w) {
    const auto& s = corpus.words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = pair_key(s[i], s[i + 1]);
      pairs.count[k] += corpus.freq[w];
      auto& list = pairs.where[k];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
  }
  for (auto& [k, c] : pairs.count) pairs.heap.push({c, k});
  return pairs;
}

// Buffers reused by every merge.
struct BpeScratch {
  std::vector<int64_t> seen_at;                 // per word: the merge step that last rewrote it
  std::unordered_map<uint64_t, int64_t> delta;  // pair -> change of its count in this merge
  std::vector<int32_t> merged_word;
};

// Merge number `step`: rewrites every word holding (left, right) with `merged` in its place and updates the pair
// counts, the words of the new pairs, and the heap.
void bpe_merge(BpeWords& corpus, BpePairs& pairs, BpeScratch& x, uint64_t pair, int32_t merged, int64_t step) {
  const int32_t left = key_left(pair), right = key_right(pair);
  std::vector<int32_t> affected = std::move(pairs.where[pair]);
  pairs.where.erase(pair);
  x.delta.clear();
  for (int32_t w : affected) {
    if (x.seen_at[w] == step) continue;
    x.seen_at[w] = step;
    auto& s = corpus.words[w];
    x.merged_word.clear();
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
        x.merged_word.push_back(merged);
        i += 2;
      } else {
        x.merged_word.push_back(s[i++]);
      }
    }
    if (x.merged_word.size() == s.size()) continue;  // the pair left this word in an earlier merge
    const int64_t f = corpus.freq[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) x.delta[pair_key(s[i], s[i + 1])] -= f;
    for (size_t i = 0; i + 1 < x.merged_word.size(); ++i) {
      uint64_t k = pair_key(x.merged_word[i], x.merged_word[i + 1]);
      x.delta[k] += f;
      if (x.merged_word[i] == merged || x.merged_word[i + 1] == merged) {
        auto& list = pairs.where[k];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    }
    s.swap(x.merged_word);
  }
  for (auto& [k, d] : x.delta) {
    if (d == 0) continue;
    int64_t& n = pairs.count[k];
    n += d;
    if (n > 0) pairs.heap.push({n, k});
  }
}

}  // namespace

BpeVocab train_bpe(const std::vector<std::string>& texts, int vocab_size, const BpeTrainOptions& opt) {
  MT_CHECK(vocab_size >= 257, "train_bpe: vocab_size {} is too small: it needs 256 byte tokens + \"{}\"", vocab_size,
           kEndOfText);
  BpeVocab v;
  std::unordered_map<std::string, int32_t> id_of;
  for (uint8_t b : gpt2_byte_order()) {
    v.tokens.emplace_back(1, static_cast<char>(b));
    id_of.emplace(v.tokens.back(), static_cast<int32_t>(v.tokens.size() - 1));
  }
  int32_t byte_id[256];
  for (int32_t id = 0; id < 256; ++id) byte_id[static_cast<uint8_t>(v.tokens[id][0])] = id;

  BpeWords corpus = bpe_words(texts, byte_id);
  BpePairs pairs = bpe_pairs(corpus);
  BpeScratch scratch;
  scratch.seen_at.assign(corpus.words.size(), -1);
  const size_t target = static_cast<size_t>(vocab_size) - 1;  // the last id is "<|endoftext|>"
  while (v.tokens.size() < target && !pairs.heap.empty()) {
    Candidate top = pairs.heap.top();
    pairs.heap.pop();
    auto cur = pairs.count.find(top.pair);
    if (cur == pairs.count.end() || cur->second != top.count || top.count <= 0) continue;  // stale entry
    if (top.count < opt.min_pair_count) break;
    const int32_t left = key_left(top.pair), right = key_right(top.pair);
    std::string bytes = v.tokens[left] + v.tokens[right];
    auto [it, fresh] = id_of.emplace(bytes, static_cast<int32_t>(v.tokens.size()));
    if (fresh) v.tokens.push_back(std::move(bytes));
    const int32_t merged = it->second;
    const int64_t step = static_cast<int64_t>(v.merges.size());
    v.merges.emplace_back(left, right);
    bpe_merge(corpus, pairs, scratch, top.pair, merged, step);
  }
  MT_CHECK(!id_of.count(std::string(kEndOfText)), "train_bpe: learned a token equal to \"{}\"", kEndOfText);
  v.tokens.emplace_back(kEndOfText);
  return v;
}

std::string gpt2_encoder_json(const BpeVocab& v) {
  std::string out = "{";
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (id) out += ", ";
    out += '"';
    for (unsigned char b : v.tokens[id]) {
      uint32_t c = gpt2_byte_char(b);
      if (c == '"' || c == '\\')
        out += '\\', out += static_cast<char>(c);
      else if (c >= 0x20 && c < 0x7F)
        out += static_cast<char>(c);
      else
        out += fmt::format("\\u{:04x}", c);  // Python's ensure_ascii escaping
    }
    out += fmt::format("\": {}", id);
  }
  return out + "}";
}

std::string gpt2_vocab_bpe(const BpeVocab& v) {
  std::string out = "#version: 0.2\n";
  for (auto [a, b] : v.merges) {
    MT_CHECK(a >= 0 && b >= 0 && a < static_cast<int32_t>(v.tokens.size()) && b < static_cast<int32_t>(v.tokens.size()),
             "gpt2_vocab_bpe: merge ({}, {}) refers to ids outside the vocabulary", a, b);
    out += bytes_to_gpt2_text(v.tokens[a]);
    out += ' ';
    out += bytes_to_gpt2_text(v.tokens[b]);
    out += '\n';
  }
  return out;
}

void write_gpt2_vocab(const BpeVocab& v, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "cannot create directory {}: {}", dir, ec.message());
  write_file_atomic(dir + "/encoder.json", gpt2_encoder_json(v));
  write_file_atomic(dir + "/vocab.bpe", gpt2_vocab_bpe(v));
}

}  // namespace mt
