// SentencePiece-style BPE (Llama 2's, Mistral's tokenizer.json): normalization, the starting symbols with byte
// fallback, and merges in HF's and SentencePiece's order. Loading is in tokenizer.cpp (load_hf).
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "megatrain/tokenizer/tokenizer.h"
#include "megatrain/tokenizer/utf8.h"

namespace mt {

namespace {

constexpr std::string_view kSpMeta = "\u2581";  // "▁", SentencePiece's stand-in for a space

}  // namespace

void Tokenizer::encode_sentencepiece(std::string_view text, bool text_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;  // HF's Prepend and Metaspace leave an empty stretch empty
  const bool starts_spaced = text.front() == ' ' || text.substr(0, kSpMeta.size()) == kSpMeta;
  const bool prefix = sp_ == SpacePrefix::Prepend || (sp_ == SpacePrefix::MetaspaceAlways && !starts_spaced) ||
                      (sp_ == SpacePrefix::MetaspaceFirst && text_start && !starts_spaced);
  // The starting symbols: each character's token, or, where the vocabulary has none (or the byte is not part of a
  // well-formed character), the "<0xXX>" token of each of its bytes. A space is "▁".
  std::vector<int32_t> symbols;
  symbols.reserve(text.size() + 1);
  const auto meta = piece_ids_.find(std::string(kSpMeta));
  auto push_char = [&](std::string_view c) {
    if (c == " ") c = kSpMeta;
    const auto it = c == kSpMeta ? meta : piece_ids_.find(std::string(c));
    if (it != piece_ids_.end()) {
      symbols.push_back(it->second);
      return;
    }
    for (unsigned char b : c) symbols.push_back(byte_id_[b]);
  };
  if (prefix) push_char(kSpMeta);
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const utf8::Char c = utf8::at(bytes, text.size(), i);
    if (c.cp ==
        utf8::kNone)  // a stray byte: its byte token (HF takes only valid UTF-8; this keeps any input encodable)
      symbols.push_back(byte_id_[bytes[i]]);
    else
      push_char(text.substr(i, c.len));
    i += c.len;
  }
  bpe_ranked(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// A heap of candidate merges (rank, position of the left symbol); a popped candidate whose two symbols are no longer
// the ones it was made from is stale and skipped. Symbols only grow into longer tokens, so "the same two ids at the
// same place" means "still current". Each merge pushes the two pairs it creates: O(n log n) for a text of n symbols.
void Tokenizer::bpe_ranked(std::vector<int32_t>& symbols) const {
  const int32_t n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  std::vector<Cand> heap;
  heap.reserve(n);
  uint64_t work = 0;
  auto push = [&](int32_t p) {
    const int32_t q = next[p];
    if (q < 0) return;
    ++work;
    if (const Merge* m = find_merge(symbols[p], symbols[q])) {
      heap.push_back({m->rank, p, symbols[p], symbols[q], m->merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Cand c = heap.back();
    heap.pop_back();
    ++work;
    const int32_t q = next[c.pos];
    if (symbols[c.pos] != c.left || q < 0 || symbols[q] != c.right) continue;  // stale
    symbols[c.pos] = c.merged;
    next[c.pos] = next[q];
    if (next[q] >= 0) prev[next[q]] = c.pos;
    symbols[q] = -1;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  add_bpe_work(work);
  int32_t w = 0;
  for (int32_t p = 0; p >= 0; p = next[p]) symbols[w++] = symbols[p];
  symbols.resize(w);
}

}  // namespace mt
