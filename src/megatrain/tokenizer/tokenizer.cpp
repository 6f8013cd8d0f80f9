#include "megatrain/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/tokenizer/unicode_tables.h"
#include "megatrain/tokenizer/utf8.h"

namespace mt {

using unicode::CharClass;

namespace {

// One character of the input: a well-formed UTF-8 sequence, or a single byte that is not part of one.
struct Unit {
  uint32_t len;
  CharClass cls;
};

inline bool cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// A bad byte (utf8.h) is one Other character.
inline Unit unit_at(const unsigned char* s, size_t n, size_t i) {
  const utf8::Char c = utf8::at(s, n, i);
  return {c.len, c.cp == utf8::kNone ? CharClass::Other : unicode::char_class(c.cp)};
}

// The regex's alternatives, tried in its order at each match start. ` ?X+` for X in {L, N, other} reduces to
// "the class of the character after an optional leading ASCII space", because a space is \s and so can
// start none of those runs itself.
template <typename Emit>
void split(std::string_view text, Emit&& emit) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'' && i + 1 < n) {  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
      unsigned char c = s[i + 1];
      if (c == 's' || c == 't' || c == 'm' || c == 'd') {
        emit(i, 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        unsigned char c2 = s[i + 2];
        if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')) {
          emit(i, 3);
          i += 3;
          continue;
        }
      }
    }
    size_t j = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    Unit u = unit_at(s, n, j);
    if (u.cls != CharClass::Space) {  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
      size_t e = j + u.len;
      while (e < n) {
        Unit v = unit_at(s, n, e);
        if (v.cls != u.cls) break;
        e += v.len;
      }
      emit(i, e - i);
      i = e;
      continue;
    }
    // `\s+(?!\S)` keeps the run but its last character when a non-space follows (that character then
    // prefixes the next word); a single space before a non-space is left to `\s+`.
    size_t e = i, last = i, count = 0;
    while (e < n) {
      Unit v = unit_at(s, n, e);
      if (v.cls != CharClass::Space) break;
      last = e;
      e += v.len;
      ++count;
    }
    size_t end = (e == n || count == 1) ? e : last;
    emit(i, end - i);
    i = end;
  }
}

// Llama 3's regex (tokenizer.h), alternatives in its order at each match start:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)       contractions, ASCII case-insensitive (as the reference JS port has them)
//   [^\r\n\p{L}\p{N}]?\p{L}+          letters, with one leading character that is no letter, digit, CR or LF
//   \p{N}{1,3}                          digits in groups of at most three
//    ?[^\s\p{L}\p{N}]+[\r\n]*           symbols, with a leading space and the line breaks after them
//   \s*[\r\n]+                         whitespace up to and including its last line break
//   \s+(?!\S) | \s+                     as GPT-2's
template <typename Emit>
void split_llama3(std::string_view text, Emit&& emit) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  auto lower = [](unsigned char c) { return static_cast<unsigned char>(c | 0x20); };
  auto is_crlf = [&](size_t k) { return s[k] == '\r' || s[k] == '\n'; };
  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'' && i + 1 < n) {
      const unsigned char c = lower(s[i + 1]);
      const bool alpha = (s[i + 1] | 0x20) >= 'a' && (s[i + 1] | 0x20) <= 'z';
      if (alpha && (c == 's' || c == 't' || c == 'm' || c == 'd')) {
        emit(i, 2);
        i += 2;
        continue;
      }
      if (alpha && i + 2 < n && ((s[i + 2] | 0x20) >= 'a' && (s[i + 2] | 0x20) <= 'z')) {
        const unsigned char c2 = lower(s[i + 2]);
        if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')) {
          emit(i, 3);
          i += 3;
          continue;
        }
      }
    }
    const Unit u = unit_at(s, n, i);
    auto run_of = [&](size_t from, CharClass cls, size_t max_units) {
      size_t e = from, k = 0;
      while (e < n && k < max_units) {
        const Unit v = unit_at(s, n, e);
        if (v.cls != cls) break;
        e += v.len;
        ++k;
      }
      return e;
    };
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (u.cls == CharClass::Letter) {
      const size_t e = run_of(i, CharClass::Letter, SIZE_MAX);
      emit(i, e - i);
      i = e;
      continue;
    }
    if (u.cls != CharClass::Number && !is_crlf(i) && i + u.len < n &&
        unit_at(s, n, i + u.len).cls == CharClass::Letter) {
      const size_t e = run_of(i + u.len, CharClass::Letter, SIZE_MAX);
      emit(i, e - i);
      i = e;
      continue;
    }
    if (u.cls == CharClass::Number) {  // \p{N}{1,3}
      const size_t e = run_of(i, CharClass::Number, 3);
      emit(i, e - i);
      i = e;
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    const size_t j = s[i] == ' ' && i + 1 < n && unit_at(s, n, i + 1).cls == CharClass::Other ? i + 1 : i;
    if (unit_at(s, n, j).cls == CharClass::Other) {
      size_t e = run_of(j, CharClass::Other, SIZE_MAX);
      while (e < n && is_crlf(e)) ++e;
      emit(i, e - i);
      i = e;
      continue;
    }
    // Whitespace: the run [i, e), its last line break, the start of its last character.
    size_t e = i, last = i, units = 0, last_break = SIZE_MAX;
    while (e < n) {
      const Unit v = unit_at(s, n, e);
      if (v.cls != CharClass::Space) break;
      if (is_crlf(e)) last_break = e;
      last = e;
      e += v.len;
      ++units;
    }
    size_t end;
    if (last_break != SIZE_MAX)
      end = last_break + 1;  // \s*[\r\n]+
    else if (e == n || units == 1)
      end = e;  // \s+(?!\S) to the end of the text, or \s+ of one character
    else
      end = last;  // \s+(?!\S): the last space goes with what follows
    emit(i, end - i);
    i = end;
  }
}

struct ByteAlphabet {
  uint32_t to_char[256];
  int16_t from_char[324];  // inverse of to_char (chars < 324), -1 where no byte maps
  std::vector<uint8_t> order;
  ByteAlphabet() {
    std::fill(std::begin(from_char), std::end(from_char), int16_t{-1});
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    for (int b = 0; b < 256; ++b)
      if (printable(b)) order.push_back(static_cast<uint8_t>(b)), to_char[b] = b;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) order.push_back(static_cast<uint8_t>(b)), to_char[b] = next++;
    for (int b = 0; b < 256; ++b) from_char[to_char[b]] = static_cast<int16_t>(b);
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {  // the alphabet stops at U+0143; longer forms are never needed
    fail("append_utf8: code point U+{:04X} outside GPT-2's byte alphabet", cp);
  }
}

// Alphabet text (UTF-8) -> raw bytes; false if a character is not in the alphabet.
bool gpt2_text_to_bytes(std::string_view text, std::string& out) {
  out.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const auto& a = alphabet();
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    if (s[i] < 0x80) {
      cp = s[i++];
    } else if ((s[i] & 0xE0) == 0xC0 && i + 1 < text.size() && cont(s[i + 1])) {
      cp = (s[i] & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= 324 || a.from_char[cp] < 0) return false;
    out += static_cast<char>(a.from_char[cp]);
  }
  return true;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

void pretokenize(std::string_view text, const std::function<void(std::string_view)>& fn, PreTokenizer kind) {
  if (kind == PreTokenizer::Llama3) return split_llama3(text, [&](size_t b, size_t len) { fn(text.substr(b, len)); });
  split(text, [&](size_t b, size_t len) { fn(text.substr(b, len)); });
}

std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizer kind) {
  std::vector<std::string_view> out;
  pretokenize(
      text, [&](std::string_view piece) { out.push_back(piece); }, kind);
  return out;
}

uint32_t gpt2_byte_char(uint8_t b) { return alphabet().to_char[b]; }
const std::vector<uint8_t>& gpt2_byte_order() { return alphabet().order; }

std::string bytes_to_gpt2_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, alphabet().to_char[b]);
  return out;
}

// Results of BPE per pre-token, shared by all threads. Bounded: cleared when full (text rarely has more
// distinct words than fit, and a miss only costs one BPE run).
struct Tokenizer::Cache {
  static constexpr size_t kMaxEntries = 1 << 18;
  static constexpr size_t kMaxPieceBytes = 256;  // longer pieces (whitespace runs, ...) are not worth keeping
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, StrHash, std::equal_to<>> map;
  std::atomic<uint64_t> bpe_work{0};  // here rather than in Tokenizer, which an atomic would make immovable
};

Tokenizer::Tokenizer() : cache_(std::make_unique<Cache>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

uint64_t Tokenizer::bpe_work() const { return cache_->bpe_work.load(std::memory_order_relaxed); }
void Tokenizer::add_bpe_work(uint64_t work) const { cache_->bpe_work.fetch_add(work, std::memory_order_relaxed); }

Tokenizer Tokenizer::load_gpt2(const std::string& dir) {
  std::string enc_path = dir + "/encoder.json", bpe_path = dir + "/vocab.bpe";
  MT_CHECK(file_exists(enc_path),
           "GPT-2 vocabulary: {} not found (run scripts/setup, or pass the directory "
           "holding encoder.json and vocab.bpe)",
           enc_path);
  MT_CHECK(file_exists(bpe_path), "GPT-2 vocabulary: {} not found", bpe_path);
  return from_gpt2_strings(read_text_file(enc_path), read_text_file(bpe_path), dir);
}

Tokenizer Tokenizer::from_gpt2_strings(std::string_view encoder_json, std::string_view vocab_bpe,
                                       const std::string& source) {
  Tokenizer t;
  const std::string enc_name = source + "/encoder.json", bpe_name = source + "/vocab.bpe";

  // encoder.json: {"<token in the byte alphabet>": id, ...} with ids 0..N-1, each once.
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(encoder_json);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", enc_name, e.what());
  }
  MT_CHECK(j.is_object() && !j.empty(), "{}: expected a non-empty JSON object of token -> id", enc_name);
  std::unordered_map<std::string, int32_t> by_text;  // alphabet text -> id (what vocab.bpe refers to)
  t.tokens_.resize(j.size());
  std::vector<bool> seen(j.size(), false);
  std::string bytes;
  for (auto& [text, v] : j.items()) {
    MT_CHECK(v.is_number_integer(), "{}: id of token \"{}\" is not an integer", enc_name, text);
    int64_t id = v.get<int64_t>();
    MT_CHECK(id >= 0 && id < static_cast<int64_t>(j.size()),
             "{}: id {} of token \"{}\" is outside 0..{} (ids must be dense)", enc_name, id, text, j.size() - 1);
    MT_CHECK(!seen[id], "{}: id {} is used by two tokens (second: \"{}\")", enc_name, id, text);
    MT_CHECK(gpt2_text_to_bytes(text, bytes), "{}: token \"{}\" has a character outside GPT-2's byte alphabet",
             enc_name, text);
    seen[id] = true;
    t.tokens_[id] = bytes;
    by_text.emplace(text, static_cast<int32_t>(id));
  }
  for (size_t id = 0; id < t.tokens_.size(); ++id) {
    auto [it, fresh] = t.ids_.emplace(t.tokens_[id], static_cast<int32_t>(id));
    MT_CHECK(fresh, "{}: ids {} and {} stand for the same bytes", enc_name, it->second, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = t.ids_.find(std::string(1, static_cast<char>(b)));
    MT_CHECK(it != t.ids_.end(), "{}: no token for byte 0x{:02X} (\"{}\")", enc_name, b,
             bytes_to_gpt2_text(std::string(1, static_cast<char>(b))));
    t.byte_id_[b] = it->second;
  }
  auto eot = t.ids_.find(std::string(kEndOfText));
  MT_CHECK(eot != t.ids_.end(), "{}: no \"{}\" token", enc_name, kEndOfText);
  t.eot_ = eot->second;
  t.specials_ = {{std::string(kEndOfText), t.eot_}};

  // vocab.bpe: a "#version" line, then one merge "left right" per line in rank order, each line ending in
  // '\n'. (GPT-2's readers take lines [1:-1] of split('\n'), silently dropping an unterminated last line.)
  std::vector<std::string_view> lines;
  for (size_t p = 0;;) {
    size_t nl = vocab_bpe.find('\n', p);
    lines.push_back(vocab_bpe.substr(p, nl == std::string_view::npos ? std::string_view::npos : nl - p));
    if (nl == std::string_view::npos) break;
    p = nl + 1;
  }
  MT_CHECK(!lines[0].empty() && lines[0][0] == '#', "{}: first line must be the \"#version\" header, got \"{}\"",
           bpe_name, lines[0].substr(0, 60));
  MT_CHECK(lines.size() == 1 || lines.back().find_first_not_of(" \t\r") == std::string_view::npos,
           "{}: the last line \"{}\" does not end with a newline (GPT-2 readers would ignore it)", bpe_name,
           lines.back().substr(0, 60));
  // The reference looks merges up by String([left, right]) == left + "," + right, so a pair of tokens whose
  // joined text equals a merge's is merged too, at that merge's rank; ranks are per joined text, the last line
  // winning. (GPT-2's vocabulary has 11 such pairs, e.g. ('",', '"') acting as ('"', ',"'), though its merge
  // order seems to keep them from ever meeting; trained vocabularies can have live ones.)
  std::unordered_map<std::string, int32_t> rank_of_key;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; };
  for (size_t ln = 1; ln + 1 < lines.size(); ++ln) {
    std::string_view line = lines[ln];
    std::vector<std::string_view> f;
    for (size_t p = 0; p < line.size();) {
      while (p < line.size() && is_space(line[p])) ++p;
      size_t q = p;
      while (q < line.size() && !is_space(line[q])) ++q;
      if (q > p) f.push_back(line.substr(p, q - p));
      p = q;
    }
    MT_CHECK(f.size() == 2, "{}:{}: expected a merge \"left right\", got \"{}\"", bpe_name, ln + 1, line.substr(0, 60));
    auto a = by_text.find(std::string(f[0])), b = by_text.find(std::string(f[1]));
    MT_CHECK(a != by_text.end() && b != by_text.end(), "{}:{}: merge \"{}\" uses a token missing from encoder.json",
             bpe_name, ln + 1, line);
    std::string joined = std::string(f[0]) + std::string(f[1]);
    MT_CHECK(by_text.count(joined), "{}:{}: merge result \"{}\" is missing from encoder.json", bpe_name, ln + 1,
             joined);
    t.merges_.emplace_back(a->second, b->second);
    rank_of_key[std::string(f[0]) + "," + std::string(f[1])] = static_cast<int32_t>(ln - 1);
  }
  for (auto& [key, rank] : rank_of_key) {
    for (size_t p = key.find(','); p != std::string::npos; p = key.find(',', p + 1)) {
      auto a = by_text.find(key.substr(0, p)), b = by_text.find(key.substr(p + 1));
      if (a == by_text.end() || b == by_text.end()) continue;
      // An accidental pair whose result is no token would make the reference emit `undefined`; leave it unmerged.
      auto m = by_text.find(a->first + b->first);
      if (m == by_text.end()) continue;
      t.pair_merge_[pair_key(a->second, b->second)] = Merge{rank, m->second};
    }
  }
  return t;
}

namespace {

// The regexes of the pre-tokenizers megatrain computes, as tokenizer.json spells them.
constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// SentencePiece-style BPE: where "▁" goes before text, from the normalizer and the pre-tokenizer of a tokenizer.json
// with model.byte_fallback. Two layouts compute what megatrain does: Llama 2's and Mistral's files (the normalizer
// Sequence[Prepend("▁"), Replace(" " -> "▁")], no pre-tokenizer), and newer ones (no normalizer, a Metaspace
// pre-tokenizer with replacement "▁" and split = false).
Tokenizer::SpacePrefix sentencepiece_prefix(const nlohmann::json& norm, const nlohmann::json& pt,
                                            const std::string& path) {
  using SP = Tokenizer::SpacePrefix;
  constexpr std::string_view kMeta = "\u2581";
  auto str = [](const nlohmann::json& o, const char* k) {
    return o.is_object() && o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
  };
  if (!norm.is_null()) {
    const nlohmann::json list = norm.is_object() && str(norm, "type") == "Sequence"
                                    ? norm.value("normalizers", nlohmann::json())
                                    : nlohmann::json();
    const bool llama2 = list.is_array() && list.size() == 2 && str(list[0], "type") == "Prepend" &&
                        str(list[0], "prepend") == kMeta && str(list[1], "type") == "Replace" &&
                        list[1].contains("pattern") && str(list[1]["pattern"], "String") == " " &&
                        str(list[1], "content") == kMeta;
    MT_CHECK(llama2,
             "{}: normalizer {} is not one megatrain computes for SentencePiece-style BPE (Llama 2's "
             "Sequence[Prepend(\"\u2581\"), Replace(\" \", \"\u2581\")])",
             path, norm.dump().substr(0, 200));
    MT_CHECK(pt.is_null(), "{}: a pre_tokenizer ({}) after Llama 2's normalizer is not supported", path,
             pt.dump().substr(0, 200));
    return SP::Prepend;
  }
  const bool metaspace = str(pt, "type") == "Metaspace" && str(pt, "replacement") == kMeta && pt.contains("split") &&
                         pt["split"].is_boolean() && !pt["split"].get<bool>();
  const std::string scheme = str(pt, "prepend_scheme");
  MT_CHECK(metaspace && (scheme == "always" || scheme == "first" || scheme == "never"),
           "{}: pre_tokenizer {} is not one megatrain computes for SentencePiece-style BPE (none after Llama 2's "
           "normalizer, or a Metaspace with replacement \"\u2581\", split = false and a prepend_scheme)",
           path, pt.dump().substr(0, 200));
  return scheme == "always" ? SP::MetaspaceAlways : scheme == "first" ? SP::MetaspaceFirst : SP::MetaspaceNever;
}

// The bytes a SentencePiece vocabulary entry stands for: "<0xXX>" is byte XX; otherwise its text with "▁" a space.
std::string sentencepiece_piece_bytes(std::string_view text) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  if (text.size() == 6 && text.substr(0, 3) == "<0x" && hex(text[3]) && hex(text[4]) && text[5] == '>')
    return std::string(1, static_cast<char>(std::stoi(std::string(text.substr(3, 2)), nullptr, 16)));
  std::string out;
  constexpr std::string_view kMeta = "\u2581";
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kMeta.size()) == kMeta) {
      out += ' ';
      i += kMeta.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// The post-processor's template for a single text: the special tokens before and after it. HF writes none (null),
// a ByteLevel one (offsets only: GPT-2's, and beside a template in Llama 3's Sequence), or a TemplateProcessing whose
// "single" is special tokens around the sequence "A" (Llama 2: [<s>, A]; Llama 3: [<|begin_of_text|>, A]).
void template_of(const nlohmann::json& post, const std::string& path, std::vector<int32_t>& prefix,
                 std::vector<int32_t>& suffix) {
  auto type = [](const nlohmann::json& o) {
    return o.is_object() && o.contains("type") && o["type"].is_string() ? o["type"].get<std::string>() : std::string();
  };
  std::vector<const nlohmann::json*> parts;
  if (type(post) == "Sequence" && post.contains("processors") && post["processors"].is_array())
    for (const nlohmann::json& p : post["processors"]) parts.push_back(&p);
  else if (!post.is_null())
    parts.push_back(&post);
  bool seen = false;
  for (const nlohmann::json* p : parts) {
    if (type(*p) == "ByteLevel") continue;
    MT_CHECK(type(*p) == "TemplateProcessing",
             "{}: post_processor {} is not one megatrain computes (none, ByteLevel, "
             "or a TemplateProcessing of special tokens around the text)",
             path, p->dump().substr(0, 200));
    MT_CHECK(!seen, "{}: the post_processor has two TemplateProcessing steps", path);
    seen = true;
    const nlohmann::json& single = p->contains("single") ? (*p)["single"] : nlohmann::json();
    const nlohmann::json& specials = p->contains("special_tokens") ? (*p)["special_tokens"] : nlohmann::json();
    MT_CHECK(single.is_array(), "{}: post_processor TemplateProcessing has no \"single\" list", path);
    bool text = false;
    for (const nlohmann::json& item : single) {
      if (item.is_object() && item.contains("Sequence")) {
        MT_CHECK(!text, "{}: post_processor template {} holds the text twice", path, single.dump().substr(0, 200));
        text = true;
        continue;
      }
      const nlohmann::json& st = item.is_object() && item.contains("SpecialToken") ? item["SpecialToken"]
                                                                                   : nlohmann::json();
      const std::string name = st.is_object() && st.contains("id") && st["id"].is_string() ? st["id"].get<std::string>()
                                                                                           : "";
      MT_CHECK(!name.empty() && specials.is_object() && specials.contains(name) && specials[name].contains("ids") &&
                   specials[name]["ids"].is_array(),
               "{}: post_processor template item {} is neither the text nor a special token with ids", path,
               item.dump().substr(0, 200));
      for (const nlohmann::json& id : specials[name]["ids"]) {
        MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
                 "{}: post_processor special token {} has id {}", path, name, id.dump());
        (text ? suffix : prefix).push_back(id.get<int32_t>());
      }
    }
    MT_CHECK(text, "{}: post_processor template {} has no place for the text", path, single.dump().substr(0, 200));
  }
}

// A member of a tokenizer.json object: o[k] where it is a string (hf_flag: a boolean), else "" (absent).
std::string hf_str(const nlohmann::json& o, const char* k) {
  return o.is_object() && o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
}
bool hf_flag(const nlohmann::json& o, const char* k, bool absent) {
  return o.is_object() && o.contains(k) && o[k].is_boolean() ? o[k].get<bool>() : absent;
}

// The file's JSON, an object with a "model" object.
nlohmann::json read_hf_tokenizer_json(const std::string& path) {
  MT_CHECK(file_exists(path), "tokenizer {} not found", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  MT_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
           "{}: no \"model\" object: not an HF "
           "tokenizer.json",
           path);
  return j;
}

bool hf_byte_level(const nlohmann::json& o, bool regex) {
  return hf_str(o, "type") == "ByteLevel" && !hf_flag(o, "add_prefix_space", false) &&
         hf_flag(o, "use_regex", true) == regex;
}

// The pre-tokenizer of a byte-level BPE: GPT-2's ByteLevel with its regex, or a Split on Llama 3's (or GPT-2's)
// regex followed by a plain ByteLevel.
PreTokenizer hf_pre_tokenizer(const nlohmann::json& pt, const std::string& path) {
  if (hf_byte_level(pt, true)) return PreTokenizer::Gpt2;
  const nlohmann::json* list = pt.is_object() && hf_str(pt, "type") == "Sequence" && pt.contains("pretokenizers") &&
                                       pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2
                                   ? &pt["pretokenizers"]
                                   : nullptr;
  const nlohmann::json split = list ? (*list)[0] : nlohmann::json();
  const std::string regex = split.is_object() && split.contains("pattern") ? hf_str(split["pattern"], "Regex") : "";
  MT_CHECK(list && hf_str(split, "type") == "Split" && hf_str(split, "behavior") == "Isolated" &&
               !hf_flag(split, "invert", false) && hf_byte_level((*list)[1], false) &&
               (regex == kLlama3Regex || regex == kGpt2Regex),
           "{}: pre_tokenizer {} is not one megatrain computes (GPT-2's ByteLevel, or a Split on GPT-2's or Llama "
           "3's regex followed by a ByteLevel)",
           path, pt.dump().substr(0, 300));
  return regex == kLlama3Regex ? PreTokenizer::Llama3 : PreTokenizer::Gpt2;
}

// What would change the ids and that megatrain does not compute: refused rather than ignored.
void refuse_hf_model_options(const nlohmann::json& m, const std::string& path) {
  MT_CHECK(!m.contains("dropout") || m["dropout"].is_null() || (m["dropout"].is_number() && m["dropout"] == 0),
           "{}: model.dropout = {} (BPE dropout, random merges) is not supported", path,
           m.value("dropout", nlohmann::json()).dump());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    MT_CHECK(hf_str(m, k).empty(), "{}: model.{} = \"{}\" is not supported", path, k, hf_str(m, k));
}

// model.vocab: the ids by the token's text, and the token's bytes by id (text in GPT-2's byte alphabet, or
// SentencePiece pieces, whose ids piece_ids gets by their text).
struct HfVocab {
  std::unordered_map<std::string, int32_t> by_text;
  std::map<int64_t, std::string> bytes_of;
};

HfVocab read_hf_vocab(const nlohmann::json& m, bool sp, const std::string& path,
                      std::unordered_map<std::string, int32_t>& piece_ids) {
  MT_CHECK(m.contains("vocab") && m["vocab"].is_object() && !m["vocab"].empty(),
           "{}: model.vocab must be a "
           "non-empty object of token -> id",
           path);
  HfVocab vocab;
  std::string bytes;
  for (auto& [text, v] : m["vocab"].items()) {
    MT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 31),
             "{}: model.vocab[\"{}\"] is not a token id", path, text);
    if (sp) {
      bytes = sentencepiece_piece_bytes(text);
      piece_ids.emplace(text, v.get<int32_t>());
    } else {
      MT_CHECK(gpt2_text_to_bytes(text, bytes), "{}: token \"{}\" has a character outside the byte-level alphabet",
               path, text);
    }
    MT_CHECK(vocab.bytes_of.emplace(v.get<int64_t>(), bytes).second, "{}: id {} is used by two tokens", path, v.dump());
    vocab.by_text.emplace(text, v.get<int32_t>());
  }
  return vocab;
}

// added_tokens (literal text): their (content, id), each id also entered in bytes_of.
std::vector<std::pair<std::string, int32_t>> read_hf_added_tokens(const nlohmann::json& j, const std::string& path,
                                                                  std::map<int64_t, std::string>& bytes_of) {
  std::vector<std::pair<std::string, int32_t>> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const nlohmann::json& a : j["added_tokens"]) {
      MT_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && !hf_str(a, "content").empty(),
               "{}: an added_tokens entry without an id and a content: {}", path, a.dump().substr(0, 120));
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = hf_str(a, "content");
      auto [it, fresh] = bytes_of.emplace(id, content);
      MT_CHECK(fresh || it->second == content,
               "{}: added token \"{}\" has id {}, which the vocabulary gives to "
               "another token",
               path, content, id);
      added.emplace_back(content, static_cast<int32_t>(id));
    }
  return added;
}

// tokens (id -> bytes) and ids (bytes -> id) of bytes_of, whose ids must be dense from 0.
void hf_dense_ids(const std::map<int64_t, std::string>& bytes_of, const std::string& path,
                  std::vector<std::string>& tokens, std::unordered_map<std::string, int32_t>& ids) {
  const int64_t size = bytes_of.rbegin()->first + 1;
  MT_CHECK(static_cast<int64_t>(bytes_of.size()) == size,
           "{}: token ids are not dense: {} tokens but the largest "
           "id is {}",
           path, bytes_of.size(), size - 1);
  tokens.resize(static_cast<size_t>(size));
  for (auto& [id, b] : bytes_of) tokens[static_cast<size_t>(id)] = b;
  for (auto& [id, b] : bytes_of) ids.emplace(b, static_cast<int32_t>(id));  // the lower id where two share bytes
}

// Each byte's token: with byte_fallback (sp) its "<0xXX>" piece, else the token of the byte alone.
void hf_byte_ids(bool sp, const std::unordered_map<std::string, int32_t>& piece_ids,
                 const std::unordered_map<std::string, int32_t>& ids, const std::string& path,
                 int32_t (&byte_id)[256]) {
  for (int b = 0; b < 256; ++b) {
    if (sp) {  // byte_fallback: the byte's own "<0xXX>" token (the byte alone may also be a character's token)
      auto it = piece_ids.find(fmt::format("<0x{:02X}>", b));
      MT_CHECK(it != piece_ids.end(), "{}: model.byte_fallback is set but model.vocab has no \"<0x{:02X}>\"", path, b);
      byte_id[b] = it->second;
      continue;
    }
    auto it = ids.find(std::string(1, static_cast<char>(b)));
    MT_CHECK(it != ids.end(), "{}: no token for byte 0x{:02X}", path, b);
    byte_id[b] = it->second;
  }
}

// The end of a document among the added tokens: Llama 3's <|end_of_text|>, GPT-2's <|endoftext|> or
// SentencePiece's </s>.
int32_t hf_end_of_text(const std::vector<std::pair<std::string, int32_t>>& added, const std::string& path) {
  int32_t eot = -1;
  for (std::string_view name : {std::string_view("<|end_of_text|>"), kEndOfText, std::string_view("</s>")})
    for (auto& [content, id] : added)
      if (eot < 0 && content == name) eot = id;
  MT_CHECK(eot >= 0, "{}: no end-of-text token among added_tokens (<|end_of_text|>, {} or </s>)", path, kEndOfText);
  return eot;
}

// model.merges in rank order, "left right" strings or [left, right] pairs (newer files): emit(left, right, merged)
// with the tokens' ids for each.
template <class Emit>
void read_hf_merges(const nlohmann::json& m, const std::string& path,
                    const std::unordered_map<std::string, int32_t>& by_text, Emit&& emit) {
  MT_CHECK(m.contains("merges") && m["merges"].is_array(), "{}: model.merges must be a list", path);
  for (const nlohmann::json& e : m["merges"]) {
    std::string left, right;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      MT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
               "{}: merge {} is not \"left right\"", path, e.dump());
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else {
      MT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), "{}: merge {} is not a pair",
               path, e.dump().substr(0, 80));
      left = e[0].get<std::string>(), right = e[1].get<std::string>();
    }
    auto a = by_text.find(left), b = by_text.find(right), r = by_text.find(left + right);
    MT_CHECK(a != by_text.end() && b != by_text.end() && r != by_text.end(),
             "{}: merge {} uses or makes a token missing from model.vocab", path, e.dump());
    emit(a->second, b->second, r->second);
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return load_hf(path);
  if (fs::is_regular_file(fs::path(path) / "tokenizer.json", ec) && !fs::exists(fs::path(path) / "encoder.json", ec))
    return load_hf((fs::path(path) / "tokenizer.json").string());
  return load_gpt2(path);
}

std::string Tokenizer::missing_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec) || fs::is_regular_file(fs::path(path) / "tokenizer.json", ec)) return "";
  for (const char* f : {"encoder.json", "vocab.bpe"})
    if (!fs::is_regular_file(fs::path(path) / f, ec))
      return fmt::format("{} has no {} (GPT-2's files: encoder.json and vocab.bpe) and no tokenizer.json (an HF "
                         "tokenizer)",
                         path, f);
  return "";
}

Tokenizer Tokenizer::load_hf(const std::string& path) {
  nlohmann::json j = read_hf_tokenizer_json(path);
  const nlohmann::json& m = j["model"];
  MT_CHECK(hf_str(m, "type") == "BPE",
           "{}: model.type is \"{}\"; megatrain reads BPE tokenizers (byte-level, or "
           "SentencePiece-style with byte_fallback)",
           path, hf_str(m, "type"));
  Tokenizer t;
  const nlohmann::json pt = j.value("pre_tokenizer", nlohmann::json());
  const nlohmann::json norm = j.value("normalizer", nlohmann::json());
  if (hf_flag(m, "byte_fallback", false)) {
    t.sp_ = sentencepiece_prefix(norm, pt, path);
  } else {
    MT_CHECK(norm.is_null(), "{}: a normalizer ({}) is not supported with byte-level BPE", path,
             norm.dump().substr(0, 120));
  }
  if (t.sp_ == SpacePrefix::None) t.pre_ = hf_pre_tokenizer(pt, path);  // else no pre-tokenizer: the text is one word
  t.ignore_merges_ = hf_flag(m, "ignore_merges", false);
  MT_CHECK(!t.ignore_merges_ || t.sp_ == SpacePrefix::None,
           "{}: model.ignore_merges with byte_fallback is not "
           "supported (no Llama 2 or Mistral file sets it)",
           path);
  refuse_hf_model_options(m, path);

  // Ids: model.vocab and added_tokens, dense from 0.
  const bool sp = t.sp_ != SpacePrefix::None;
  HfVocab vocab = read_hf_vocab(m, sp, path, t.piece_ids_);
  const std::vector<std::pair<std::string, int32_t>> added = read_hf_added_tokens(j, path, vocab.bytes_of);
  hf_dense_ids(vocab.bytes_of, path, t.tokens_, t.ids_);
  hf_byte_ids(sp, t.piece_ids_, t.ids_, path, t.byte_id_);
  // Specials: the added tokens.
  t.specials_ = added;
  t.eot_ = hf_end_of_text(added, path);
  template_of(j.value("post_processor", nlohmann::json()), path, t.prefix_, t.suffix_);
  for (const std::vector<int32_t>* ids : {&t.prefix_, &t.suffix_})
    for (int32_t id : *ids)
      MT_CHECK(id < t.vocab_size(), "{}: the post_processor's special token id {} is outside the vocabulary (0..{})",
               path, id, t.vocab_size() - 1);

  int32_t rank = 0;
  read_hf_merges(m, path, vocab.by_text, [&](int32_t left, int32_t right, int32_t merged) {
    t.merges_.emplace_back(left, right);
    t.pair_merge_.emplace(pair_key(left, right), Merge{rank, merged});  // the first rank of a pair wins
    ++rank;
  });
  return t;
}

const Tokenizer::Merge* Tokenizer::find_merge(int32_t left, int32_t right) const {
  auto it = pair_merge_.find(pair_key(left, right));
  return it == pair_merge_.end() ? nullptr : &it->second;
}

// BPE over one pre-token with the reference's exact order of merges: each round takes the lowest rank among
// the current pairs (if pairs of different tokens share it, the last one in the word), then merges every
// occurrence of that pair left to right. A heap of (rank, position) candidates makes a round cost
// O(merges * log n) instead of a scan of the word, so long pre-tokens stay fast.
void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const bool cacheable = piece.size() <= Cache::kMaxPieceBytes;
  if (cacheable) {
    std::lock_guard lock(cache_->mu);
    auto it = cache_->map.find(piece);
    if (it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  struct Sym {
    int32_t id, prev, next;  // id -1: absorbed into its left neighbour
  };
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Sym> sym(n);
  for (int32_t i = 0; i < n; ++i)
    sym[i] = {byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  std::vector<Cand> heap, batch, deferred;
  uint64_t work = 0;
  auto push = [&](int32_t p) {
    int32_t q = sym[p].next;
    if (q < 0) return;
    ++work;
    if (const Merge* m = find_merge(sym[p].id, sym[q].id)) {
      heap.push_back({m->rank, p, sym[p].id, sym[q].id, m->merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  auto pop = [&] {
    ++work;
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    Cand c = heap.back();
    heap.pop_back();
    return c;
  };
  // Symbols only ever grow, so a candidate whose two tokens are still in place is still current.
  auto valid = [&](const Cand& c) {
    int32_t q = sym[c.pos].next;
    return sym[c.pos].id == c.left && q >= 0 && sym[q].id == c.right;
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = pop();
    if (!valid(c)) continue;
    batch.assign(1, c);
    while (!heap.empty() && heap.front().rank == c.rank) {
      Cand d = pop();
      if (valid(d)) batch.push_back(d);
    }
    const Cand& chosen = batch.back();  // batch is in word order
    int32_t left = chosen.left, right = chosen.right;
    deferred.clear();
    for (const Cand& e : batch) {
      if (e.left != left || e.right != right) {
        deferred.push_back(e);
        continue;
      }
      if (!valid(e)) continue;  // overlapped by the previous occurrence ("aaa" merges as "aa" "a")
      int32_t p = e.pos, q = sym[p].next, r = sym[q].next;
      sym[p].id = e.merged;
      sym[p].next = r;
      if (r >= 0) sym[r].prev = p;
      sym[q].id = -1;
      if (sym[p].prev >= 0) push(sym[p].prev);
      push(p);
    }
    for (const Cand& e : deferred) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  }
  cache_->bpe_work.fetch_add(work, std::memory_order_relaxed);
  size_t first = out.size();
  for (int32_t p = 0; p >= 0; p = sym[p].next) out.push_back(sym[p].id);
  if (cacheable) {
    std::lock_guard lock(cache_->mu);
    if (cache_->map.size() >= Cache::kMaxEntries) cache_->map.clear();
    cache_->map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out, bool text_start) const {
  if (sp_ != SpacePrefix::None) return encode_sentencepiece(text, text_start, out);
  auto piece = [&](size_t b, size_t len) {
    if (len == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(text[b])]);
      return;
    }
    const std::string_view p = text.substr(b, len);
    if (ignore_merges_) {  // a pre-token that is a token is that token, whatever the merges would make of it
      auto it = ids_.find(std::string(p));
      if (it != ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    bpe(p, out);
  };
  if (pre_ == PreTokenizer::Llama3)
    split_llama3(text, piece);
  else
    split(text, piece);
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  bool start = true;  // the stretch of text at offset 0 (SentencePiece's prefix "first" goes only there)
  if (allow_special && !specials_.empty()) {
    // The earliest special token in the text (the longest at a tie), then the text before it as plain text.
    for (;;) {
      size_t at = std::string_view::npos, len = 0;
      int32_t id = -1;
      for (const auto& [bytes, sid] : specials_) {
        const size_t f = text.find(bytes);
        if (f != std::string_view::npos && (f < at || (f == at && bytes.size() > len)))
          at = f, len = bytes.size(), id = sid;
      }
      if (at == std::string_view::npos) break;
      encode_plain(text.substr(0, at), out, start);
      out.push_back(id);
      text.remove_prefix(at + len);
      start = false;
    }
  }
  encode_plain(text, out, start);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode_append(text, out, allow_special);
  return out;
}

std::string_view Tokenizer::token_bytes(int id) const {
  MT_CHECK(id >= 0 && id < vocab_size(), "token id {} is outside the vocabulary (0..{})", id, vocab_size() - 1);
  return tokens_[id];
}

int Tokenizer::token_id(std::string_view bytes) const {
  auto it = ids_.find(std::string(bytes));
  return it == ids_.end() ? -1 : it->second;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    MT_CHECK(id >= 0 && id < vocab_size(), "decode: token id {} at position {} is outside the vocabulary (0..{})", id,
             i, vocab_size() - 1);
    out += tokens_[id];
  }
  return out;
}

std::string Tokenizer::decode_text(std::span<const int32_t> ids) const {
  std::string out = decode(ids);
  const bool prefixed = sp_ == SpacePrefix::Prepend || sp_ == SpacePrefix::MetaspaceAlways ||
                        sp_ == SpacePrefix::MetaspaceFirst;
  if (prefixed && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace mt
