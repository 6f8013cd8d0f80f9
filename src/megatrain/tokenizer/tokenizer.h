// BPE tokenizers, id for id as their references compute them. Two families:
//   - byte-level BPE: GPT-2's own files, and HF tokenizer.json files of GPT-2 and Llama 3 (below);
//   - SentencePiece-style BPE: HF tokenizer.json files with model.byte_fallback (Llama 2, Mistral, TinyLlama), see
//     load_hf and tokenizer_sentencepiece.cpp.
// GPT-2's, id-for-id identical to the reference encoder (the npm package gpt-3-encoder, itself a port of OpenAI's
// encoder.py):
//   1. the text is split into pre-tokens by the regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (implemented by hand over code points; classes as JavaScript defines them, see unicode_tables.h);
//   2. each pre-token's UTF-8 bytes start as one token per byte and are merged by BPE in merge-rank order.
// Invalid UTF-8 never fails: each byte that is not part of a well-formed sequence counts as one character of
// the class [^\s\p{L}\p{N}] (as U+FFFD would) and is encoded as its own byte, so decode(encode(x)) == x for
// any byte string.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mt {

// How text is cut into pre-tokens before BPE: GPT-2's regex (above), or Llama 3's (OpenAI's cl100k's too),
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// both by hand over code points, with JavaScript's classes (unicode_tables.h).
enum class PreTokenizer { Gpt2, Llama3 };

// Calls fn for each pre-token of text, in order; the pieces tile the text exactly.
void pretokenize(std::string_view text, const std::function<void(std::string_view)>& fn,
                 PreTokenizer kind = PreTokenizer::Gpt2);
std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizer kind = PreTokenizer::Gpt2);

// GPT-2 writes token bytes in a printable alphabet: byte b is the code point gpt2_byte_char(b)
// (printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100..U+0143).
uint32_t gpt2_byte_char(uint8_t b);
// The 256 bytes in the order of GPT-2's ids 0..255 (the printable ones first).
const std::vector<uint8_t>& gpt2_byte_order();
std::string bytes_to_gpt2_text(std::string_view bytes);  // raw bytes -> alphabet (UTF-8), e.g. " the" -> "Ġthe"

inline constexpr std::string_view kEndOfText = "<|endoftext|>";

class Tokenizer {
 public:
  // Where a SentencePiece-style tokenizer puts its "▁" before text (None: byte-level BPE). HF applies it to each
  // stretch of text between special tokens: Prepend (the normalizer Llama 2's and Mistral's files carry) always;
  // Metaspace's prepend_scheme "always" unless the stretch already starts with "▁" or a space, "first" the same but
  // only at the start of the whole text, "never" not at all.
  enum class SpacePrefix : uint8_t { None, Prepend, MetaspaceAlways, MetaspaceFirst, MetaspaceNever };

  // Loads dir/encoder.json and dir/vocab.bpe (GPT-2's formats). Default: default_gpt2_vocab_dir().
  static Tokenizer load_gpt2(const std::string& dir);
  // The same from the files' contents; `source` names them in error messages.
  static Tokenizer from_gpt2_strings(std::string_view encoder_json, std::string_view vocab_bpe,
                                     const std::string& source = "<memory>");
  // An HF tokenizer.json of a byte-level BPE (GPT-2's, Llama 3's): model.vocab and model.merges, the pre-tokenizer
  // (GPT-2's ByteLevel regex, or a Split on Llama 3's regex before a ByteLevel without one), model.ignore_merges (a
  // pre-token that is itself a token is not merged up to), and added_tokens, matched literally in text when
  // allow_special. eot() is <|end_of_text|> (Llama 3) or <|endoftext|> (GPT-2).
  // Or a SentencePiece-style BPE (model.byte_fallback = true: Llama 2's, Mistral's): spaces become "▁" and one "▁"
  // goes before the text (the normalizer Prepend("▁") + Replace(" ", "▁"), or a Metaspace pre-tokenizer that does
  // not split); the text is one word whose characters start as their tokens, or as the "<0xXX>" tokens of their
  // UTF-8 bytes where the vocabulary lacks them; merges go one pair at a time, the lowest rank first and the
  // leftmost at a tie. eot() is </s>.
  // What this cannot compute exactly (another normalizer or regex, a Metaspace that splits) is an error naming it.
  static Tokenizer load_hf(const std::string& tokenizer_json);
  // `path`: an HF tokenizer.json, or a directory holding one (and no encoder.json), else GPT-2's files.
  static Tokenizer load(const std::string& path);
  // "" when load(path) would find a tokenizer's files there (not checking their contents); else what is missing.
  static std::string missing_files(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // allow_special: the literal text of a special token ("<|endoftext|>"; an HF tokenizer's added tokens) becomes
  // its single id; otherwise it is plain text (as in the reference JS encoder, which knows no special tokens).
  // Thread-safe.
  std::vector<int32_t> encode(std::string_view utf8, bool allow_special = true) const;
  void encode_append(std::string_view utf8, std::vector<int32_t>& out, bool allow_special = true) const;
  // The tokens' bytes, concatenated: a continuation of text (a SentencePiece token's "▁" is a space). Throws on an
  // id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;
  // The inverse of encode for a whole text: decode() less the one leading space that a SentencePiece-style
  // tokenizer put before the text (HF's decoders drop it too). The same as decode() for byte-level BPE. Exact for
  // Llama 2's and Mistral's Prepend; with a Metaspace ("always", "first"), a text that starts with a space got no
  // prefix, so that space is the one dropped, as HF's Metaspace decoder drops it.
  std::string decode_text(std::span<const int32_t> ids) const;

  int eot() const { return eot_; }
  // The special tokens an HF tokenizer.json's post-processor (TemplateProcessing) puts around one text, as HF's
  // tokenizer(text) adds them: Llama 2's <s> and Llama 3's <|begin_of_text|> before it; empty for GPT-2's. encode()
  // never adds them; prepare-data puts the prefix before each document (after the shard format's end-of-text) and
  // generate before the prompt, so a model sees a text start as the tokenizer's own models were trained to.
  const std::vector<int32_t>& template_prefix() const { return prefix_; }
  const std::vector<int32_t>& template_suffix() const { return suffix_; }
  PreTokenizer pre_tokenizer() const { return pre_; }  // byte-level BPE only
  bool sentencepiece() const { return sp_ != SpacePrefix::None; }
  SpacePrefix space_prefix() const { return sp_; }
  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  std::string_view token_bytes(int id) const;  // the raw bytes a token stands for
  int token_id(std::string_view bytes) const;  // the token whose bytes these are, or -1
  // The merges in rank order, as (left id, right id); merged id = token_id(left bytes + right bytes).
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  // Pairs looked up plus heap pops in BPE so far (cache hits add none): a clock-free cost measure for growth tests.
  uint64_t bpe_work() const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct Cache;

  Tokenizer();
  // text_start: text begins at offset 0 of what encode() was given (it is not after a special token).
  void encode_plain(std::string_view text, std::vector<int32_t>& out, bool text_start) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  // SentencePiece-style BPE (tokenizer_sentencepiece.cpp): the stretch normalized, then ranked merges over it.
  void encode_sentencepiece(std::string_view text, bool text_start, std::vector<int32_t>& out) const;
  // Merges over symbol ids one pair at a time, the lowest rank first and the leftmost at a tie: HF's and
  // SentencePiece's order (GPT-2's bpe() merges every occurrence of a pair in one round; the two differ where a
  // merge uses a token that a later-ranked merge makes, as SentencePiece-derived merge lists do).
  void bpe_ranked(std::vector<int32_t>& symbols) const;
  void add_bpe_work(uint64_t work) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> tokens_;               // id -> bytes
  std::unordered_map<std::string, int32_t> ids_;  // bytes -> id
  std::vector<std::pair<int32_t, int32_t>> merges_;
  // (left << 32 | right) -> merge; includes the pairs the reference merges by accident (see tokenizer.cpp).
  std::unordered_map<uint64_t, Merge> pair_merge_;
  int32_t byte_id_[256] = {};
  int32_t eot_ = -1;
  PreTokenizer pre_ = PreTokenizer::Gpt2;
  bool ignore_merges_ = false;
  SpacePrefix sp_ = SpacePrefix::None;
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's template around a single text
  // SentencePiece-style: a vocabulary entry's text ("▁the", "é") -> id, for the characters a text starts as.
  std::unordered_map<std::string, int32_t> piece_ids_;
  // Special tokens matched in text when allow_special: (bytes, id). GPT-2's files: <|endoftext|> alone.
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace mt
