// Tokenizer tests. The oracle is the reference encoder itself (the npm package gpt-3-encoder, run by node
// through tests/tools/gpt2_encode.js), node's regex engine for the character classes, a literal C++
// transcription of the reference's BPE loop for long words, and a naive recount for BPE training.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>
#include <unordered_map>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/assets.h"
#include "megatrain/core/rng.h"
#include "megatrain/tokenizer/bpe_train.h"
#include "megatrain/tokenizer/tokenizer.h"
#include "megatrain/tokenizer/unicode_tables.h"
#include "support/megatrain.h"

namespace {

namespace fs = std::filesystem;
using mt::Tokenizer;
using Ids = std::vector<int32_t>;

const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load_gpt2(mt::default_gpt2_vocab_dir());
  return t;
}

std::string tmp_dir() {
  static const std::string d = [] {
    std::string p = std::string(MT_BINARY_DIR) + "/tokenizer_test_tmp." + std::to_string(::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

struct RemoveTmpDir : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(std::string(MT_BINARY_DIR) + "/tokenizer_test_tmp." + std::to_string(::getpid()), ec);
  }
};
[[maybe_unused]] auto* const kRemoveTmpDir = ::testing::AddGlobalTestEnvironment(new RemoveTmpDir);

void run_node(const std::vector<std::string>& args) {
  std::string cmd = "node";
  for (const auto& a : args) cmd += " '" + a + "'";
  int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "node failed (is node installed and scripts/setup run?): " << cmd;
}

// The reference encoder's ids for each text, using the vocabulary in vocab_dir.
std::vector<Ids> reference_encode(const std::vector<std::string>& texts, const std::string& vocab_dir) {
  std::string in = tmp_dir() + "/ref_in.json", out = tmp_dir() + "/ref_out.json";
  mt::write_file_atomic(in, nlohmann::json(texts).dump());
  run_node({std::string(MT_SOURCE_DIR) + "/tests/tools/gpt2_encode.js", mt::default_gpt2_vocab_dir(), vocab_dir, in,
            out});
  if (::testing::Test::HasFatalFailure()) return {};
  auto j = nlohmann::json::parse(mt::read_text_file(out));
  return j.get<std::vector<Ids>>();
}

std::string escaped(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

std::string show_ids(const Tokenizer& tok, const Ids& ids, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < std::min(to, ids.size()); ++i)
    out += fmt::format("{}{}\"{}\"", i == from ? "" : " ", ids[i], escaped(tok.token_bytes(ids[i])));
  return out;
}

// Compares per text; reports only the first mismatch, with the text around it.
void expect_same_ids(const Tokenizer& tok, const std::vector<std::string>& texts, const std::vector<Ids>& ours,
                     const std::vector<Ids>& ref) {
  ASSERT_EQ(ours.size(), ref.size());
  for (size_t c = 0; c < texts.size(); ++c) {
    if (ours[c] == ref[c]) continue;
    size_t k = 0;
    while (k < ours[c].size() && k < ref[c].size() && ours[c][k] == ref[c][k]) ++k;
    size_t at = tok.decode(std::span(ref[c]).first(k)).size();
    size_t lo = k < 4 ? 0 : k - 4;
    FAIL() << "text " << c << ": first difference at token " << k << " (byte " << at << ")\n"
           << "  text there: \"" << escaped(texts[c].substr(at < 40 ? 0 : at - 40, 40)) << "|"
           << escaped(texts[c].substr(at, 40)) << "\"\n"
           << "  ours: " << show_ids(tok, ours[c], lo, k + 4) << "\n"
           << "  ref:  " << show_ids(tok, ref[c], lo, k + 4);
  }
}

// ---- test text -------------------------------------------------------------------------------------------

std::string brown_text(size_t min_bytes, size_t first_file = 0) {
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(mt::default_brown_dir())) {
    std::string name = e.path().filename().string();
    if (name.size() == 4 && std::isdigit(static_cast<unsigned char>(name[3]))) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (size_t i = first_file; i < files.size() && text.size() < min_bytes; ++i) text += mt::read_text_file(files[i]);
  EXPECT_GE(text.size(), min_bytes) << "Brown corpus missing or short (run scripts/setup)";
  return text;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | cp >> 6);
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | cp >> 12);
    s += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | cp >> 18);
    s += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    s += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Random lines mixing every case the pre-tokenizer distinguishes: contractions in both cases, numbers,
// punctuation runs, all kinds of whitespace, many scripts with combining marks, emoji sequences and random
// code points from every plane. Items are joined by random separators or by nothing (mixed-script words).
std::string generated_text(size_t bytes, uint64_t seed) {
  // (laid out by hand)
  // clang-format off
  static const std::vector<std::string> words = {
      "the", "The", "HELLO", "don't", "DON'T", "I'm", "I'M", "we're", "WE'RE", "they've", "THEY'VE", "you'll",
      "YOU'LL", "he'd", "HE'D", "it's", "IT'S", "can't", "CAN'T", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
      "'S", "'T", "'Re", "'VE", "'M", "'LL", "'D", "'x", "''", "'''s", "rock'n'roll", "o'clock", "'", "'r", "'l",
      "café", "naïve", "Ångström", "résumé", "cafe\u0301", "Zu\u0308rich", "straße", "ﬁnancial", "Ελληνικά",
      "ΑΒΓ", "Русский", "язык", "中文字符", "日本語のテキスト", "カタカナ", "한국어", "العربية", "مرحبا",
      "עִבְרִית", "हिन्दी", "नमस्ते", "संस्कृतम्", "ภาษาไทย", "ქართული", "Ɐ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐍈𐌰", "𓀀𓀁",
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇺🇸🇯🇵", "🤖", "🧑🏿‍💻", "\U000E0067\U000E007F", "\U0010FFFD", "\uE000",
      "\uFFFD", "\uFFFE", "\u200D", "x\u0300\u0301\u0302", "\u20DD", "\uFE0F"};
  static const std::vector<std::string> numbers = {
      "0", "42", "3.14159", "1,000,000", "2024-01-01", "0x1F", "1e-9", "٣٤٥", "१२३", "１２３", "½", "²³", "Ⅻ",
      "𝟘𝟙𝟚", "〇", "⑦", "007", "12345678901234567890"};
  static const std::vector<std::string> punct = {
      "!!!", "...", "?!", "--", "—", "–", "“quoted”", "«»", "(", ")", "[", "]", "{", "}", "<|endoftext|>", "<|",
      "|>", "@#$%^&*", "\"", "\",\"", "[\"\",\"\"]", "\",\",\"", "'\",'", "],[", "\\", "/", "~", "`", "©", "®",
      "™", "€", "£", "¥", "°", "§", "¶", "•", "…", "‽", "\x01\x02", "\x7f", "::", ";", "==>", "#include", "->"};
  static const std::vector<std::string> spaces = {
      " ", " ", " ", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "  \n  ", " \t ",
      "\u00a0", "\u2000", "\u2003", "\u200a", "\u3000", "\u2028", "\u2029", "\u202f", "\u205f", "\u1680", "\ufeff",
      "\u0085", "\u180e", "\u200b", "\v", "\f", "\x1c", "\x1f", " \u00a0 ", "\u3000\u3000"};
  // clang-format on
  mt::Rng rng(seed);
  auto pick = [&](const std::vector<std::string>& v) -> const std::string& { return v[rng.below(v.size())]; };
  std::string s;
  while (s.size() < bytes) {
    size_t items = 1 + rng.below(16);
    for (size_t i = 0; i < items; ++i) {
      uint64_t kind = rng.below(100);
      if (kind < 45)
        s += pick(words);
      else if (kind < 60)
        s += pick(numbers);
      else if (kind < 72)
        s += pick(punct);
      else if (kind < 80) {
        for (uint64_t n = 1 + rng.below(6); n-- > 0;) {
          uint32_t cp;  // half from the BMP, which is mostly assigned
          do cp = static_cast<uint32_t>(rng.below(rng.below(2) ? 0x110000 : 0x10000));
          while (cp >= 0xD800 && cp <= 0xDFFF);
          append_utf8(s, cp);
        }
      } else {
        for (uint64_t n = 1 + rng.below(12); n-- > 0;) s += static_cast<char>('a' + rng.below(26));
      }
      if (rng.below(4)) s += pick(spaces);
    }
    if (rng.below(3) == 0) s += std::string(rng.below(4), ' ');  // trailing spaces
    s += rng.below(5) ? "\n" : "\r\n";
  }
  return s;
}

// Chunks of about `size` bytes ending at line ends (the reference is slow on long strings).
std::vector<std::string> line_chunks(const std::string& text, size_t size) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', std::min(text.size(), b + size));
    e = e == std::string::npos ? text.size() : e + 1;
    out.push_back(text.substr(b, e - b));
    b = e;
  }
  return out;
}

// ---- an independent transcription of the reference's bpe(), quadratic but obviously faithful ------------

struct NaiveGpt2 {
  std::unordered_map<std::string, int32_t> encoder;  // byte-alphabet text -> id
  std::unordered_map<std::string, int32_t> ranks;    // String([left, right]) -> rank, last line wins
  std::string byte_char[256];

  NaiveGpt2() {
    std::string dir = mt::default_gpt2_vocab_dir();
    encoder = nlohmann::json::parse(mt::read_text_file(dir + "/encoder.json"))
                  .get<std::unordered_map<std::string, int32_t>>();
    std::string bpe = mt::read_text_file(dir + "/vocab.bpe");
    std::vector<std::string> lines;
    for (size_t p = 0, nl; (nl = bpe.find('\n', p)) != std::string::npos; p = nl + 1)
      lines.push_back(bpe.substr(p, nl - p));
    for (size_t i = 1; i < lines.size(); ++i) {
      size_t sp = lines[i].find(' ');
      ranks[lines[i].substr(0, sp) + "," + lines[i].substr(sp + 1)] = static_cast<int32_t>(i - 1);
    }
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      append_utf8(byte_char[b], printable ? b : 256 + n++);
    }
  }

  Ids bpe(std::string_view bytes) const {
    std::vector<std::string> word;
    for (unsigned char b : bytes) word.push_back(byte_char[b]);
    while (word.size() > 1) {
      int32_t best = INT32_MAX;
      size_t at = SIZE_MAX;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        auto it = ranks.find(word[i] + "," + word[i + 1]);
        if (it != ranks.end() && it->second <= best) best = it->second, at = i;  // `<=`: the last pair wins ties
      }
      if (at == SIZE_MAX) break;
      std::string first = word[at], second = word[at + 1];
      std::vector<std::string> merged;
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == first && word[i + 1] == second)
          merged.push_back(first + second), i += 2;
        else
          merged.push_back(word[i++]);
      }
      word.swap(merged);
    }
    Ids ids;
    for (auto& w : word) ids.push_back(encoder.at(w));
    return ids;
  }
};

// ---- tests -----------------------------------------------------------------------------------------------

TEST(Tokenizer, UnicodeClassesMatchJavaScript) {
  std::string path = tmp_dir() + "/classes.bin";
  run_node({std::string(MT_SOURCE_DIR) + "/tests/tools/char_classes.js", path});
  ASSERT_FALSE(HasFatalFailure());
  std::string ref = mt::read_text_file(path);
  ASSERT_EQ(ref.size(), 0x110000u);
  using mt::unicode::CharClass;
  const CharClass cls[4] = {CharClass::Other, CharClass::Letter, CharClass::Number, CharClass::Space};
  for (uint32_t cp = 0; cp < 0x110000; ++cp)
    ASSERT_EQ(static_cast<int>(mt::unicode::char_class(cp)), static_cast<int>(cls[static_cast<int>(ref[cp])]))
        << fmt::format("U+{:04X} (tables from Unicode {}; regenerate with scripts/gen_unicode_tables.js)", cp,
                       mt::unicode::unicode_version());
}

TEST(Tokenizer, PretokenizeKnownSplits) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world", {"Hello", " world"}},
      {"a  b", {"a", " ", " b"}},
      {"a   \n\nb", {"a", "   \n", "\n", "b"}},
      {"x  ", {"x", "  "}},
      {"I'm DON'T", {"I", "'m", " DON", "'", "T"}},
      {"it's'S they'll", {"it", "'s", "'", "S", " they", "'ll"}},
      {" 123abc½", {" 123", "abc", "½"}},
      {"\u00a0a", {"\u00a0", "a"}},
      {" \u00a0a", {" ", "\u00a0", "a"}},
      {"a\xff"
       "b",
       {"a", "\xff", "b"}},                // invalid byte: one [^\s\p{L}\p{N}] character
      {" \xe2\x82", {" \xe2\x82"}},        // truncated sequence: two such characters
      {"\xed\xa0\x80", {"\xed\xa0\x80"}},  // an encoded surrogate is invalid too
      {" \xe0\x81\x81"
       "a",
       {" \xe0\x81\x81", "a"}},  // an overlong 'A' is no letter
      {" \xf0\x9f\x98\x80!", {" \xf0\x9f\x98\x80!"}},
      {"", {}},
  };
  for (auto& [text, want] : cases) {
    std::vector<std::string> got;
    for (auto p : mt::pretokenize(text)) got.emplace_back(p);
    EXPECT_EQ(got, want) << "text \"" << escaped(text) << "\"";
  }
}

TEST(Tokenizer, KnownIds) {
  const Tokenizer& t = gpt2();
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eot(), 50256);
  EXPECT_EQ(t.merges().size(), 50000u);
  EXPECT_EQ(t.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(t.encode("I'm DON'T"), (Ids{40, 1101, 23917, 6, 51}));
  EXPECT_EQ(t.encode("  hello   \n\n world  "), (Ids{220, 23748, 220, 220, 220, 628, 995, 220, 220}));
  EXPECT_EQ(t.encode("\",\""), (Ids{2430}));
  EXPECT_EQ(t.encode("\",\",\""), (Ids{2430, 553}));
  EXPECT_EQ(t.token_bytes(995), " world");
  EXPECT_EQ(t.token_id(" world"), 995);
  EXPECT_EQ(t.token_id("no such token, surely"), -1);
}

TEST(Tokenizer, EndOfText) {
  const Tokenizer& t = gpt2();
  EXPECT_EQ(t.encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_EQ(t.encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));
  EXPECT_EQ(t.encode("<|endoftext|><|endoftext|>"), (Ids{50256, 50256}));
  EXPECT_EQ(t.encode("<|endoftext|>", false), (Ids{27, 91, 437, 1659, 5239, 91, 29}));  // the reference's ids
  EXPECT_EQ(t.encode("a<|endoftext|>b", false), (Ids{64, 27, 91, 437, 1659, 5239, 91, 29, 65}));
  EXPECT_EQ(t.decode(Ids{64, 50256, 65}), "a<|endoftext|>b");
}

TEST(Tokenizer, BadIdsAndFilesGiveClearErrors) {
  const Tokenizer& t = gpt2();
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const mt::Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message([&] { t.decode(Ids{1, 50257}); }).find("50257"), std::string::npos);
  EXPECT_NE(message([&] { t.decode(Ids{-3}); }).find("-3"), std::string::npos);
  EXPECT_NE(message([&] { t.token_bytes(60000); }).find("60000"), std::string::npos);
  EXPECT_NE(message([] { Tokenizer::load_gpt2("/nonexistent/vocab"); }).find("/nonexistent/vocab/encoder.json"),
            std::string::npos);

  // Small well-formed files to break one thing at a time.
  mt::BpeVocab v = mt::train_bpe({"aaaa aaaa bb bb"}, 260);
  std::string enc = mt::gpt2_encoder_json(v), bpe = mt::gpt2_vocab_bpe(v);
  ASSERT_NO_THROW(Tokenizer::from_gpt2_strings(enc, bpe));
  auto load_error = [&](std::string e, std::string b) {
    return message([&] { Tokenizer::from_gpt2_strings(e, b, "dir"); });
  };
  EXPECT_NE(load_error("{\"a\": 0", bpe).find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error("[1, 2]", bpe).find("JSON object"), std::string::npos);
  std::string no_bang = enc;
  no_bang.replace(no_bang.find("\"!\": 0"), 6, "\"\\u0100!\": 0");
  EXPECT_NE(load_error(no_bang, bpe).find("no token for byte 0x21"), std::string::npos);
  std::string dup_id = enc;
  dup_id.replace(dup_id.find("\"#\": 2"), 6, "\"#\": 1");
  EXPECT_NE(load_error(dup_id, bpe).find("id 1 is used by two tokens"), std::string::npos);
  EXPECT_NE(load_error(enc, bpe.substr(bpe.find('\n') + 1)).find("#version"), std::string::npos);
  EXPECT_NE(load_error(enc, bpe + "a b c\n").find("expected a merge"), std::string::npos);
  EXPECT_NE(load_error(enc, bpe + "a zzz\n").find("missing from encoder.json"), std::string::npos);
  EXPECT_NE(load_error(enc, bpe + "b b").find("does not end with a newline"), std::string::npos);
  std::string no_eot = enc.substr(0, enc.rfind(", \"<|endoftext|>\"")) + "}";
  EXPECT_NE(load_error(no_eot, bpe).find("<|endoftext|>"), std::string::npos);
}

// The main compatibility check: >= 1 MB of Brown corpus (tags left in) and generated text, id for id.
TEST(Tokenizer, MatchesReferenceEncoderOnAMegabyte) {
  std::string text = brown_text(700'000) + generated_text(400'000, 7);
  ASSERT_GE(text.size(), 1'000'000u);
  std::vector<std::string> chunks = line_chunks(text, 4096);
  std::vector<Ids> ref = reference_encode(chunks, mt::default_gpt2_vocab_dir());
  ASSERT_FALSE(HasFatalFailure());
  const Tokenizer& t = gpt2();
  std::vector<Ids> ours;
  for (auto& c : chunks) ours.push_back(t.encode(c, /*allow_special=*/false));
  expect_same_ids(t, chunks, ours, ref);

  // The whole text in one call, with a cold cache: round trip, and the speed for information only.
  Tokenizer fresh = Tokenizer::load_gpt2(mt::default_gpt2_vocab_dir());
  auto t0 = std::chrono::steady_clock::now();
  Ids all = fresh.encode(text, false);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s (cold cache)\n", text.size(), all.size(), secs);
  EXPECT_EQ(fresh.decode(all), text);
}

TEST(Tokenizer, LongWordsMatchReferenceBpeLoop) {
  const NaiveGpt2 naive;
  mt::Rng rng(3);
  // Each string is one pre-token; the punctuation set exercises the reference's accidental merges.
  const std::vector<std::string> alphabets = {"\",[]'{}().:;", "abcdefghijklmnopqrstuvwxyz", "0123456789", "eeeeeeet"};
  for (const auto& a : alphabets) {
    for (int rep = 0; rep < 3; ++rep) {
      std::string s;
      for (int i = 0; i < 1500; ++i) s += a[rng.below(a.size())];
      Ids want = naive.bpe(s);
      EXPECT_EQ(gpt2().encode(s), want) << "alphabet " << a;
    }
  }
  for (std::string s : {"\",\",\"", "[\"\",\"\",\"\"]", "'',''','", "\",\",\",\",\"\"", "],[],[],["}) {
    EXPECT_EQ(gpt2().encode(s), naive.bpe(s)) << s;
  }
}

// The reference finds merges by String([left, right]), i.e. left + "," + right, so in a vocabulary with
// commas in its tokens other pairs merge too, and two pairs can share a rank. This vocabulary makes both
// happen; GPT-2's own has such pairs but they never seem to fire on real text.
TEST(Tokenizer, CommaJoinedMergeKeysActAsTheReferenceDoes) {
  mt::BpeVocab v = mt::train_bpe({}, 257);  // the 256 bytes + <|endoftext|>
  v.tokens.pop_back();
  auto add = [&](std::string l, std::string r) {
    auto id = [&](const std::string& s) {
      return static_cast<int32_t>(std::find(v.tokens.begin(), v.tokens.end(), s) - v.tokens.begin());
    };
    v.merges.emplace_back(id(l), id(r));
    v.tokens.push_back(l + r);
  };
  add(",", "?");  // so "!,?" -> "!" ",?", which the reference then joins as if it were ("!,", "?")
  add("!", ",");
  add("!,", "?");
  add("!,", "!");
  add("!", "!,!");  // key "!,!,!" ...
  add("!,!", "!");  // ... the same key: in "!" "!,!" "!" both pairs have this rank, and the last one wins
  v.tokens.emplace_back(mt::kEndOfText);
  std::string dir = tmp_dir() + "/commas";
  mt::write_gpt2_vocab(v, dir);
  Tokenizer t = Tokenizer::load_gpt2(dir);

  std::vector<std::string> texts = {"!,?", "!!,!!", "!!,!!,!!", "?!,?!,!"};
  mt::Rng rng(23);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (uint64_t n = 2 + rng.below(14); n-- > 0;) s += "!,?"[rng.below(3)];
    texts.push_back(s);
  }
  std::vector<Ids> ref = reference_encode(texts, dir);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Ids> ours;
  for (auto& s : texts) ours.push_back(t.encode(s));
  expect_same_ids(t, texts, ours, ref);
  EXPECT_EQ(ours[0], (Ids{t.token_id("!,?")}));
  EXPECT_EQ(ours[1], (Ids{t.token_id("!"), t.token_id("!,!!")}));
}

// A quadratic BPE would take minutes on a long pre-token (a megabyte of letters, a run of spaces). Checked on BPE's
// own work count, not on a clock: each byte starts one candidate pair and each merge adds at most two, each popped
// once, so the work per byte is bounded and twice the length costs twice the work (2.00 here). A rescan of the word
// per merge makes that 4x; one per merge round (as the reference does) about 2.4x, at thousands of units per byte.
TEST(Tokenizer, LongPreTokensCostLinearWork) {
  const Tokenizer& t = gpt2();
  mt::Rng rng(5);
  const std::vector<std::pair<const char*, std::function<std::string(size_t)>>> kinds = {
      {"letters",
       [&](size_t n) {
         std::string s(n, 'a');
         for (auto& c : s) c = static_cast<char>('a' + rng.below(26));
         return s;
       }},
      {"spaces", [](size_t n) { return std::string(n, ' ') + "x"; }},  // n - 1 spaces (GPT-2 merges none), " x"
  };
  // Every text is a new pre-token far longer than the cache keeps, so each encode runs BPE in full.
  constexpr size_t kN = 1 << 19;
  for (const auto& [name, make] : kinds) {
    uint64_t work[2];
    for (int k = 0; k < 2; ++k) {
      std::string s = make(kN << k);
      uint64_t before = t.bpe_work();
      Ids ids = t.encode(s);
      work[k] = t.bpe_work() - before;
      EXPECT_EQ(t.decode(ids), s);
      EXPECT_GE(work[k], s.size() / 2) << name << ": bpe_work() must count the work per byte";
      EXPECT_LE(work[k], 8 * s.size()) << name << ": more than a bounded number of candidates per byte";
    }
    std::printf("BPE work on one pre-token of %s: %zu bytes %llu, %zu bytes %llu (x%.2f)\n", name, kN,
                static_cast<unsigned long long>(work[0]), 2 * kN, static_cast<unsigned long long>(work[1]),
                static_cast<double>(work[1]) / static_cast<double>(work[0]));
    EXPECT_LE(static_cast<double>(work[1]), 2.2 * static_cast<double>(work[0])) << name << ": superlinear BPE";
  }
}

TEST(Tokenizer, AnyBytesRoundTrip) {
  const Tokenizer& t = gpt2();
  mt::Rng rng(11);
  for (int rep = 0; rep < 3000; ++rep) {
    std::string s(rng.below(48), '\0');
    for (auto& c : s) {
      uint64_t k = rng.below(4);
      c = static_cast<char>(k == 0   ? rng.below(128)
                            : k == 1 ? ' '
                            : k == 2 ? 0x80 + rng.below(64)
                                     : 0xC0 + rng.below(64));
    }
    size_t covered = 0;
    for (auto p : mt::pretokenize(s)) {
      ASSERT_FALSE(p.empty());
      ASSERT_EQ(p.data(), s.data() + covered);
      covered += p.size();
    }
    ASSERT_EQ(covered, s.size());
    ASSERT_EQ(t.decode(t.encode(s)), s) << escaped(s);
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  Tokenizer t = Tokenizer::load_gpt2(mt::default_gpt2_vocab_dir());
  std::string text = generated_text(200'000, 13);
  Ids a, b;
  std::thread th([&] { a = t.encode(text); });
  b = t.encode(text);
  th.join();
  EXPECT_EQ(a, b);
  EXPECT_EQ(t.decode(a), text);
}

// ---- training --------------------------------------------------------------------------------------------

TEST(BpeTrain, KnownFirstMerges) {
  mt::BpeVocab v = mt::train_bpe({"ab ab ab cd"}, 259, {.min_pair_count = 1});
  auto id = [](char c) {
    const auto& order = mt::gpt2_byte_order();
    return static_cast<int32_t>(std::find(order.begin(), order.end(), static_cast<uint8_t>(c)) - order.begin());
  };
  ASSERT_EQ(v.tokens.size(), 259u);
  ASSERT_EQ(v.merges.size(), 2u);
  EXPECT_EQ(v.merges[0], std::make_pair(id('a'), id('b')));  // 3 times
  EXPECT_EQ(v.tokens[256], "ab");
  EXPECT_EQ(v.merges[1], std::make_pair(id(' '), 256));  // " ab": twice
  EXPECT_EQ(v.tokens[257], " ab");
  EXPECT_EQ(v.tokens[258], "<|endoftext|>");
  EXPECT_EQ(id('!'), 0);
  EXPECT_EQ(id(' '), 220);  // GPT-2's "Ġ"

  // Too rare to merge: the vocabulary stops short. "<|endoftext|>" separates documents.
  EXPECT_EQ(mt::train_bpe({"ab cd"}, 300).tokens.size(), 257u);
  EXPECT_EQ(mt::train_bpe({"x<|endoftext|>y<|endoftext|>x<|endoftext|>y"}, 300, {.min_pair_count = 1}).tokens.size(),
            257u);
  EXPECT_THROW(mt::train_bpe({"abc"}, 256), mt::Error);
}

// Every merge must be the most frequent pair at its step (naive recount over the words), ties to the smaller ids.
TEST(BpeTrain, EachMergeIsTheMostFrequentPair) {
  std::string text = brown_text(60'000, 20);
  mt::BpeVocab v = mt::train_bpe({text}, 256 + 300 + 1);
  ASSERT_EQ(v.tokens.size(), 557u);
  std::unordered_map<std::string, int64_t> freq;
  for (auto p : mt::pretokenize(text)) ++freq[std::string(p)];
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < v.tokens.size(); ++i) id_of[v.tokens[i]] = static_cast<int32_t>(i);
  std::vector<std::pair<Ids, int64_t>> words;
  for (auto& [w, f] : freq) {
    Ids ids;
    for (char c : w) ids.push_back(id_of.at(std::string(1, c)));
    words.emplace_back(ids, f);
  }
  for (size_t m = 0; m < v.merges.size(); ++m) {
    std::map<std::pair<int32_t, int32_t>, int64_t> count;
    for (auto& [ids, f] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i) count[{ids[i], ids[i + 1]}] += f;
    auto best = count.begin();
    for (auto it = count.begin(); it != count.end(); ++it)
      if (it->second > best->second) best = it;  // std::map order: the first maximum has the smallest ids
    ASSERT_EQ(v.merges[m], best->first) << "merge " << m << " (count " << count[v.merges[m]] << " vs " << best->second
                                        << ")";
    auto [l, r] = v.merges[m];
    int32_t merged = id_of.at(v.tokens[l] + v.tokens[r]);
    for (auto& [ids, f] : words) {
      Ids out;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == l && ids[i + 1] == r)
          out.push_back(merged), i += 2;
        else
          out.push_back(ids[i++]);
      }
      ids.swap(out);
    }
  }
}

TEST(BpeTrain, WritesGpt2FilesExactly) {
  // Re-writing GPT-2's own vocabulary must reproduce its files byte for byte.
  const Tokenizer& t = gpt2();
  mt::BpeVocab v;
  for (int id = 0; id < t.vocab_size(); ++id) v.tokens.emplace_back(t.token_bytes(id));
  v.merges = t.merges();
  std::string dir = mt::default_gpt2_vocab_dir();
  EXPECT_TRUE(mt::gpt2_encoder_json(v) == mt::read_text_file(dir + "/encoder.json"));
  EXPECT_TRUE(mt::gpt2_vocab_bpe(v) == mt::read_text_file(dir + "/vocab.bpe"));
}

TEST(BpeTrain, TrainedVocabularyLoadsHereAndInTheReference) {
  std::string train_text = brown_text(300'000, 40) + generated_text(50'000, 17);
  auto t0 = std::chrono::steady_clock::now();
  mt::BpeVocab v = mt::train_bpe({train_text}, 1500);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("trained %zu tokens from %zu bytes in %.3f s\n", v.tokens.size(), train_text.size(), secs);
  ASSERT_EQ(v.tokens.size(), 1500u);
  std::string dir = tmp_dir() + "/trained";
  mt::write_gpt2_vocab(v, dir);
  Tokenizer t = Tokenizer::load_gpt2(dir);
  EXPECT_EQ(t.vocab_size(), 1500);
  EXPECT_EQ(t.eot(), 1499);

  std::string test_text = brown_text(100'000, 80) + generated_text(50'000, 19);
  std::vector<std::string> chunks = line_chunks(test_text, 4096);
  std::vector<Ids> ref = reference_encode(chunks, dir);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Ids> ours;
  size_t tokens = 0;
  for (auto& c : chunks) {
    ours.push_back(t.encode(c, false));
    tokens += ours.back().size();
    ASSERT_EQ(t.decode(ours.back()), c);
  }
  expect_same_ids(t, chunks, ours, ref);
  EXPECT_LT(tokens, test_text.size() / 2) << "merges should compress text well below one token per byte";
}

// ---- HF tokenizer.json: Llama 3's, against an independent JS port (npm llama3-tokenizer-js) ------------------

std::string llama3_package() { return mt::resource_path(".deps/npm/node_modules/llama3-tokenizer-js"); }

// The package's vocabulary, merges and special tokens as a tokenizer.json (tests/tools/llama3_tokenizer.js dump),
// written once per build tree (ctest runs each case as a process: the first takes the lock and writes it, the
// others wait and read it) and loaded once per process.
std::string dumped_tokenizer_json(const std::string& tool, const std::string& package, const std::string& name) {
  // The version in the name: a build tree keeps its dumps, so a tool that writes more (v2: the post-processor) must
  // not find an older dump under the same name.
  const std::string path = std::string(MT_BINARY_DIR) + "/test-data/v2-" + name;
  fs::create_directories(fs::path(path).parent_path());
  const int fd = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  EXPECT_GE(fd, 0);
  ::flock(fd, LOCK_EX);
  if (!fs::exists(path)) {
    run_node({std::string(MT_SOURCE_DIR) + "/tests/tools/" + tool, package, "dump", path + ".tmp"});
    if (!::testing::Test::HasFatalFailure()) fs::rename(path + ".tmp", path);
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return path;
}

std::string llama3_tokenizer_json() {
  return dumped_tokenizer_json("llama3_tokenizer.js", llama3_package(), "llama3-tokenizer.json");
}

const Tokenizer& llama3() {
  static const Tokenizer t = Tokenizer::load_hf(llama3_tokenizer_json());
  return t;
}

// bos: with the package's <|begin_of_text|> first (as HF's tokenizer(text) gives the ids).
std::vector<Ids> llama3_reference(const std::vector<std::string>& texts, bool bos = false) {
  std::string in = tmp_dir() + "/l3_in.json", out = tmp_dir() + "/l3_out.json";
  mt::write_file_atomic(in, nlohmann::json(texts).dump());
  run_node({std::string(MT_SOURCE_DIR) + "/tests/tools/llama3_tokenizer.js", llama3_package(),
            bos ? "encode-bos" : "encode", in, out});
  if (::testing::Test::HasFatalFailure()) return {};
  return nlohmann::json::parse(mt::read_text_file(out)).get<std::vector<Ids>>();
}

TEST(HfTokenizer, Llama3MatchesItsReferenceOnAQuarterMegabyte) {
  const Tokenizer& t = llama3();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.eot(), 128001);  // <|end_of_text|>
  EXPECT_EQ(t.pre_tokenizer(), mt::PreTokenizer::Llama3);
  // The post-processor's template: the package's own begin-of-text (its encode with bos) before a text, none after.
  const Ids with_bos = llama3_reference({"Hi"}, /*bos=*/true).at(0);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(t.template_prefix(), Ids{with_bos.at(0)});
  EXPECT_EQ(t.template_suffix(), Ids{});
  // Brown's prose, and generated text with every case the pre-tokenizer distinguishes (contractions in both cases,
  // digit runs, symbols before line breaks, whitespace runs with and without line breaks, many scripts).
  const std::string text = brown_text(120'000, 100) + generated_text(130'000, 23);
  const std::vector<std::string> chunks = line_chunks(text, 4096);
  const std::vector<Ids> ref = llama3_reference(chunks);
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Ids> ours;
  for (auto& c : chunks) {
    ours.push_back(t.encode(c, /*allow_special=*/false));
    ASSERT_EQ(t.decode(ours.back()), c);
  }
  expect_same_ids(t, chunks, ours, ref);
}

TEST(HfTokenizer, Llama3PreTokensAndSpecialTokens) {
  using mt::PreTokenizer;
  // Splits derived by hand from the regex (tokenizer.h), each alternative where it differs from GPT-2's.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"I'M here", {"I", "'M", " here"}},            // contractions in any case
      {"(hello) world", {"(hello", ")", " world"}},  // one non-letter may lead a word
      {" (hello", {" (", "hello"}},                  // ... but a space and a symbol go together
      {"1234567", {"123", "456", "7"}},              // digits in threes
      {"x!?\n\ny", {"x", "!?\n\n", "y"}},            // symbols take the line breaks after them
      {"a \n\n  b", {"a", " \n\n", " ", " b"}},      // whitespace up to its last line break
      {"a   b", {"a", "  ", " b"}},                  // the last space goes with the word
  };
  for (const auto& [text, want] : cases) {
    std::vector<std::string> got;
    for (auto p : mt::pretokenize(text, PreTokenizer::Llama3)) got.emplace_back(p);
    EXPECT_EQ(got, want) << escaped(text);
  }
  // Special tokens: text when allow_special is false, one id each when true (the reference always reads them so).
  const Tokenizer& t = llama3();
  ASSERT_FALSE(HasFatalFailure());
  // Words that are one token but that BPE from their bytes splits in three or four (model.ignore_merges: found by
  // encoding every token of the vocabulary with and without it; the text above meets none).
  for (const std::string w : {" nhiên", " biệt", " değiş", " характ", " nhiệm"})
    EXPECT_EQ(t.encode(w, false).size(), 1u) << w;
  const std::string words = "Thêm nhiên biệt değiş mektedir характ nhiệm";
  EXPECT_EQ(t.encode(words, false), llama3_reference({words}).at(0));
  const std::string s = "<|begin_of_text|>Hello<|end_of_text|><|reserved_special_token_7|>";
  const Ids with = t.encode(s, /*allow_special=*/true);
  EXPECT_EQ(with, llama3_reference({s}).at(0));
  EXPECT_EQ(with.front(), 128000);
  EXPECT_EQ(with[with.size() - 2], 128001);
  EXPECT_EQ(t.decode(with), s);
  const Ids plain = t.encode(s, /*allow_special=*/false);
  EXPECT_GT(plain.size(), with.size());
  for (int32_t id : plain) EXPECT_LT(id, 128000);
}

// GPT-2's own files written as a tokenizer.json (its ByteLevel pre-tokenizer) read as the same tokenizer.
TEST(HfTokenizer, Gpt2AsTokenizerJsonEqualsItsFiles) {
  const std::string dir = mt::default_gpt2_vocab_dir();
  nlohmann::json vocab = nlohmann::json::parse(mt::read_text_file(dir + "/encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  const std::string bpe = mt::read_text_file(dir + "/vocab.bpe");
  for (size_t p = bpe.find('\n') + 1; p < bpe.size();) {
    const size_t e = bpe.find('\n', p);
    if (e > p) merges.push_back(bpe.substr(p, e - p));
    p = e + 1;
  }
  const nlohmann::json tj = {
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  const std::string path = tmp_dir() + "/gpt2-tokenizer.json";
  mt::write_file_atomic(path, tj.dump());
  const Tokenizer hf = Tokenizer::load(path);  // a file: tokenizer.json
  EXPECT_EQ(hf.vocab_size(), 50257);
  EXPECT_EQ(hf.eot(), 50256);
  const std::string text = brown_text(200'000, 120) + generated_text(100'000, 29);
  for (const std::string& c : line_chunks(text, 4096))
    ASSERT_EQ(hf.encode(c, false), gpt2().encode(c, false)) << escaped(c);
  EXPECT_EQ(hf.encode("a<|endoftext|>b", true), gpt2().encode("a<|endoftext|>b", true));
}

// `megatrain prepare-data --vocab <tokenizer.json>` over `docs`, one file each: the documents its shards hold (split
// at the end-of-text token, in no particular order), after checking every shard records the vocabulary, the
// end-of-text token and the token width (2 or 4 bytes) given.
std::vector<Ids> prepared_documents(const std::string& tokenizer_json, const std::vector<std::string>& docs,
                                    const std::string& name, int vocab, int eot, int token_bytes) {
  const std::string corpus = tmp_dir() + "/" + name + "-corpus", out = tmp_dir() + "/" + name + "-shards",
                    log = tmp_dir() + "/" + name + ".log";
  fs::create_directories(corpus);
  for (size_t i = 0; i < docs.size(); ++i) mt::write_file_atomic(fmt::format("{}/doc_{}.txt", corpus, i), docs[i]);
  const std::string cmd = fmt::format("{} prepare-data --format text --input {} --vocab {} --out {} > {} 2>&1",
                                      mt::test::kMegatrain, corpus, tokenizer_json, out, log);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << mt::read_text_file(log);
  std::vector<Ids> stored;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().extension() != ".bin") continue;
    const std::string bytes = mt::read_text_file(e.path().string());
    EXPECT_GE(bytes.size(), 1024u);
    int32_t h[8];
    std::memcpy(h, bytes.data(), sizeof h);
    EXPECT_EQ(h[1], token_bytes / 2) << "version 1: uint16 tokens, 2: uint32";
    EXPECT_EQ(h[3], vocab);
    EXPECT_EQ(h[4], eot);
    EXPECT_EQ(bytes.size(), 1024u + static_cast<size_t>(token_bytes) * static_cast<size_t>(h[2]));
    for (int32_t k = 0; k < h[2] && bytes.size() >= 1024u + static_cast<size_t>(token_bytes) * (k + 1); ++k) {
      uint32_t id = 0;
      std::memcpy(&id, bytes.data() + 1024 + static_cast<size_t>(token_bytes) * k, static_cast<size_t>(token_bytes));
      if (id == static_cast<uint32_t>(eot))
        stored.emplace_back();
      else if (!stored.empty())
        stored.back().push_back(static_cast<int32_t>(id));
    }
  }
  std::sort(stored.begin(), stored.end());
  return stored;
}

// Llama 3's: uint32 shards (its ids pass 65,535), every document's ids the reference's, <|begin_of_text|> first.
TEST(HfTokenizer, PrepareDataWritesShardsInLlama3Ids) {
  llama3();
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<std::string> docs = {
      "The jury said it did find that many of Georgia's registration laws are outmoded.",
      "Ünïcödé wörds, ЖЖЖ and 日本語: 12345 — «quoted»!\n\n  indented", "I'M SHOUTING DON'T 'LL 'VE\r\n\ttabs"};
  const std::vector<Ids> stored = prepared_documents(llama3_tokenizer_json(), docs, "l3", 128256, 128001, 4);
  std::vector<Ids> want = llama3_reference(docs, /*bos=*/true);  // each document begins as HF's tokenizer begins it
  ASSERT_FALSE(HasFatalFailure());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(stored, want);
}

// ---- SentencePiece-style BPE: Llama 2's and Mistral's, against independent JS ports ------------------------
// (npm llama-tokenizer-js and mistral-tokenizer-js, SentencePiece's algorithm with each vocabulary baked in; their
// vocabulary and merges dumped as the tokenizer.json transformers saves, by tests/tools/sentencepiece_tokenizer.js)

struct SpModel {
  const char* package;   // under .deps/npm/node_modules
  int32_t hello, world;  // "Hello world": the ids of "▁Hello" and "▁world"
};
const SpModel kLlama2{"llama-tokenizer-js", 15043, 3186};
const SpModel kMistral{"mistral-tokenizer-js", 22557, 1526};

std::string sp_package(const SpModel& m) {
  return mt::resource_path(std::string(".deps/npm/node_modules/") + m.package);
}

std::string sp_tokenizer_json(const SpModel& m) {
  return dumped_tokenizer_json("sentencepiece_tokenizer.js", sp_package(m), std::string(m.package) + ".json");
}

std::vector<Ids> sp_reference(const SpModel& m, const std::vector<std::string>& texts, bool bos = false) {
  std::string in = tmp_dir() + "/sp_in.json", out = tmp_dir() + "/sp_out.json";
  mt::write_file_atomic(in, nlohmann::json(texts).dump());
  run_node({std::string(MT_SOURCE_DIR) + "/tests/tools/sentencepiece_tokenizer.js", sp_package(m),
            bos ? "encode-bos" : "encode", in, out});
  if (::testing::Test::HasFatalFailure()) return {};
  return nlohmann::json::parse(mt::read_text_file(out)).get<std::vector<Ids>>();
}

void expect_sp_matches_reference(const SpModel& m, const std::string& text) {
  const Tokenizer t = Tokenizer::load_hf(sp_tokenizer_json(m));
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_TRUE(t.sentencepiece());
  EXPECT_EQ(t.space_prefix(), Tokenizer::SpacePrefix::Prepend);
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.eot(), 2);  // </s>
  EXPECT_EQ(t.encode("Hello world"), (Ids{m.hello, m.world}));
  const Ids with_bos = sp_reference(m, {"Hello world"}, /*bos=*/true).at(0);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(with_bos, (Ids{1, m.hello, m.world}));  // the package's <s>, as HF's tokenizer(text) gives it
  EXPECT_EQ(t.template_prefix(), Ids{1});
  const std::vector<std::string> chunks = line_chunks(text, 4096);
  const std::vector<Ids> ref = sp_reference(m, chunks);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<Ids> ours;
  for (auto& c : chunks) {
    ours.push_back(t.encode(c, /*allow_special=*/false));
    ASSERT_EQ(t.decode_text(ours.back()), c);
    ASSERT_EQ(t.decode(ours.back()), " " + c);  // the prefixed space, as a continuation would carry it
  }
  expect_same_ids(t, chunks, ours, ref);
}

// Brown's prose and the generated text of every script (characters Llama 2 lacks fall back to their bytes). The
// merges of both come from SentencePiece scores: about 10,000 of each list use a token that a later merge makes,
// where GPT-2's merge-every-occurrence rounds would give other ids, so this checks the one-at-a-time order too.
TEST(SentencePieceTokenizer, Llama2MatchesItsReference) {
  expect_sp_matches_reference(kLlama2, brown_text(100'000, 40) + generated_text(60'000, 31));
}

TEST(SentencePieceTokenizer, MistralMatchesItsReference) {
  expect_sp_matches_reference(kMistral, brown_text(100'000, 60) + generated_text(60'000, 37));
}

// A tokenizer.json of single characters, their byte tokens and the merges given, with the SentencePiece layout given.
std::string tiny_sp_tokenizer(const std::vector<std::string>& pieces, const std::vector<std::string>& merges,
                              const nlohmann::json& normalizer, const nlohmann::json& pre_tokenizer) {
  nlohmann::json vocab = nlohmann::json::object();
  int32_t id = 0;
  for (const char* s : {"<unk>", "<s>", "</s>"}) vocab[s] = id++;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
  for (const std::string& p : pieces) vocab[p] = id++;
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", i}, {"content", std::vector<std::string>{"<unk>", "<s>", "</s>"}[i]}, {"special", true}});
  const nlohmann::json tj = {
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tokenizer},
      {"model", {{"type", "BPE"}, {"byte_fallback", true}, {"vocab", vocab}, {"merges", merges}}}};
  static int n = 0;
  const std::string path = fmt::format("{}/tiny-sp-{}.json", tmp_dir(), n++);
  mt::write_file_atomic(path, tj.dump());
  return path;
}

const nlohmann::json kLlama2Normalizer = {
    {"type", "Sequence"},
    {"normalizers",
     {{{"type", "Prepend"}, {"prepend", "\u2581"}},
      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};

nlohmann::json metaspace(const std::string& scheme, bool split = false) {
  return {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", split}};
}

// Known answers, worked by hand from the rules in tokenizer.h.
TEST(SentencePieceTokenizer, MergesOneAtATimeLowestRankThenLeftmost) {
  // "ab" + "a" ranks before "a" + "b". On "abab": the first "ab" is made, then at once "aba" (rank 0) takes the
  // second "a", so the second "ab" is never made: "aba" "b". GPT-2's rounds would make both "ab"s first: "ab" "ab".
  // tiny_sp_tokenizer's ids: 0-2 <unk> <s> </s>, 3-258 the bytes, then the pieces in order from 259.
  const Tokenizer t = Tokenizer::load_hf(tiny_sp_tokenizer({"\u2581", "a", "b", "ab", "aba"}, {"ab a", "a b"},
                                                           nlohmann::json(), metaspace("never")));
  const int32_t a = 260, b = 261, aba = 263;
  EXPECT_EQ(t.encode("abab"), (Ids{aba, b}));
  // Equal ranks go left to right: "aaa" with only "a" + "a" is "aa" "a".
  const Tokenizer u = Tokenizer::load_hf(tiny_sp_tokenizer({"\u2581", "a", "aa"}, {"a a"}, nlohmann::json(),
                                                           metaspace("never")));
  EXPECT_EQ(u.encode("aaa"), (Ids{261, a}));
  // A character the vocabulary lacks is its UTF-8 bytes' tokens; so is a byte that starts no character.
  EXPECT_EQ(u.encode("\xC3\xA9"), (Ids{3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(u.encode("a\xFF"), (Ids{a, 3 + 0xFF}));
  EXPECT_EQ(u.decode(u.encode("a\xFF\xC3\xA9 a")), "a\xFF\xC3\xA9 a");
}

TEST(SentencePieceTokenizer, WhereTheSpaceGoesBeforeText) {
  const std::vector<std::string> pieces = {"\u2581", "a", "b"};
  auto ids_of = [](const Tokenizer& t, const std::string& text) {
    std::string shown;
    for (int32_t id : t.encode(text, /*allow_special=*/true))
      shown += id == 2 ? "</s>" : std::string(t.token_bytes(id));
    return shown;
  };
  // Llama 2's normalizer: a "▁" before every stretch of text, also one that starts with a space, also after </s>.
  const Tokenizer prepend = Tokenizer::load_hf(tiny_sp_tokenizer(pieces, {}, kLlama2Normalizer, nullptr));
  EXPECT_EQ(ids_of(prepend, "a b"), " a b");
  EXPECT_EQ(ids_of(prepend, " a"), "  a");
  EXPECT_EQ(ids_of(prepend, "a</s>b"), " a</s> b");
  EXPECT_EQ(ids_of(prepend, "</s>"), "</s>");
  EXPECT_EQ(prepend.decode_text(prepend.encode(" a")), " a");
  // Metaspace "always": the same, but not before a stretch that already starts with a space.
  const Tokenizer always = Tokenizer::load_hf(tiny_sp_tokenizer(pieces, {}, nullptr, metaspace("always")));
  EXPECT_EQ(ids_of(always, " a"), " a");
  EXPECT_EQ(ids_of(always, "a</s>b"), " a</s> b");
  // "first": only at the start of the whole text.
  const Tokenizer first = Tokenizer::load_hf(tiny_sp_tokenizer(pieces, {}, nullptr, metaspace("first")));
  EXPECT_EQ(ids_of(first, "a</s>b"), " a</s>b");
  EXPECT_EQ(ids_of(first, "</s>b"), "</s>b");
  // "never": nowhere, and decode_text then strips nothing.
  const Tokenizer never = Tokenizer::load_hf(tiny_sp_tokenizer(pieces, {}, nullptr, metaspace("never")));
  EXPECT_EQ(ids_of(never, "a b"), "a b");
  EXPECT_EQ(never.decode_text(never.encode(" a")), " a");
}

// Tokenizer::load_hf(path) must fail with a message holding `part`.
void expect_refused(const std::string& path, const std::string& part) {
  std::string e;
  try {
    Tokenizer::load_hf(path);
  } catch (const mt::Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find(part), std::string::npos) << e;
}

// `megatrain tokenize encode --with-template` gives HF's tokenizer(text): the package's own ids with its <s> first.
TEST(SentencePieceTokenizer, TheCliEncodesWithTheTemplateOnRequest) {
  const std::string json = sp_tokenizer_json(kLlama2);
  ASSERT_FALSE(HasFatalFailure());
  const std::string text = "The jury said it did find that many of Georgia's laws are outmoded.";
  mt::write_file_atomic(tmp_dir() + "/cli_in.txt", text);
  auto cli = [&](const std::string& flags) {
    const std::string out = tmp_dir() + "/cli_out.txt";
    EXPECT_EQ(std::system(fmt::format("{} tokenize encode --vocab {} --in {}/cli_in.txt --out {} {}",
                                      mt::test::kMegatrain, json, tmp_dir(), out, flags)
                              .c_str()),
              0);
    Ids ids;
    std::istringstream in(mt::read_text_file(out));
    for (int32_t id; in >> id;) ids.push_back(id);
    return ids;
  };
  EXPECT_EQ(cli("--with-template"), sp_reference(kLlama2, {text}, /*bos=*/true).at(0));
  EXPECT_EQ(cli(""), sp_reference(kLlama2, {text}).at(0));
}

// The post-processor's template, worked by hand: which tokens go before and after a text, and what is refused.
TEST(SentencePieceTokenizer, TheTemplateAroundAText) {
  const std::vector<std::string> pieces = {"\u2581", "a"};
  auto with_post = [&](const nlohmann::json& post) {
    nlohmann::json j =
        nlohmann::json::parse(mt::read_text_file(tiny_sp_tokenizer(pieces, {}, kLlama2Normalizer, nullptr)));
    j["post_processor"] = post;
    static int n = 0;
    const std::string path = fmt::format("{}/post-{}.json", tmp_dir(), n++);
    mt::write_file_atomic(path, j.dump());
    return path;
  };
  auto special = [](const std::string& name) {
    return nlohmann::json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
  };
  const nlohmann::json text = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const nlohmann::json ids = {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}, {"</s>", {{"id", "</s>"}, {"ids", {2}}}}};
  const nlohmann::json both = {
      {"type", "TemplateProcessing"}, {"single", {special("<s>"), text, special("</s>")}}, {"special_tokens", ids}};
  const Tokenizer t = Tokenizer::load_hf(with_post(both));
  EXPECT_EQ(t.template_prefix(), Ids{1});
  EXPECT_EQ(t.template_suffix(), Ids{2});
  EXPECT_EQ(t.encode("a"), (Ids{259, 260}));  // encode() itself adds neither
  const Tokenizer none = Tokenizer::load_hf(with_post({{"type", "ByteLevel"}, {"trim_offsets", true}}));
  EXPECT_TRUE(none.template_prefix().empty() && none.template_suffix().empty());
  const Tokenizer seq =
      Tokenizer::load_hf(with_post({{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, both}}}));
  EXPECT_EQ(seq.template_prefix(), Ids{1});
  expect_refused(with_post({{"type", "BertProcessing"}}), "post_processor {\"type\":\"BertProcessing\"} is not one");
  expect_refused(with_post({{"type", "TemplateProcessing"}, {"single", {special("<s>")}}, {"special_tokens", ids}}),
                 "has no place for the text");
  expect_refused(with_post({{"type", "TemplateProcessing"},
                            {"single", {special("<cls>"), text}},
                            {"special_tokens", ids}}),
                 "neither the text nor a special token with ids");
  nlohmann::json far = ids;
  far["<s>"]["ids"] = {70000};
  expect_refused(with_post({{"type", "TemplateProcessing"},
                            {"single", {special("<s>"), text}},
                            {"special_tokens", far}}),
                 "id 70000 is outside the vocabulary");
}

// A whole document is one word: the merges' work must grow with its length, not its square. The bound follows from
// the algorithm: n - 1 pairs pushed at the start, at most two more per merge (at most n - 1 merges), one pop each.
TEST(SentencePieceTokenizer, ALongDocumentCostsLinearWork) {
  const Tokenizer t = Tokenizer::load_hf(sp_tokenizer_json(kLlama2));
  ASSERT_FALSE(HasFatalFailure());
  const std::string text = brown_text(400'000, 10);
  const uint64_t before = t.bpe_work();
  const Ids ids = t.encode(text, false);
  const uint64_t work = t.bpe_work() - before;
  EXPECT_LE(work, 6 * (text.size() + 1));
  EXPECT_EQ(t.decode_text(ids), text);
}

// Llama 2's: uint16 shards recording its vocabulary and </s>, every document's ids the reference's, <s> first.
TEST(SentencePieceTokenizer, PrepareDataWritesShardsInLlama2Ids) {
  const std::string json = sp_tokenizer_json(kLlama2);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<std::string> docs = {"The jury said it did find that many of Georgia's laws are outmoded.",
                                         " Ünïcödé wörds, ЖЖЖ and 日本語: 12345\n\n  indented", "</s> is text here"};
  const std::vector<Ids> stored = prepared_documents(json, docs, "sp", 32000, 2, 2);
  std::vector<Ids> want = sp_reference(kLlama2, docs, /*bos=*/true);  // <s> first, as HF's tokenizer gives it
  ASSERT_FALSE(HasFatalFailure());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(stored, want);
}

TEST(SentencePieceTokenizer, WhatItCannotComputeIsRefusedByName) {
  auto refused = expect_refused;
  const std::vector<std::string> pieces = {"\u2581", "a"};
  refused(tiny_sp_tokenizer(pieces, {}, nullptr, metaspace("always", /*split=*/true)), "split = false");
  refused(tiny_sp_tokenizer(pieces, {}, nullptr, metaspace("sometimes")), "prepend_scheme");
  refused(tiny_sp_tokenizer(pieces, {}, nullptr, nullptr), "is not one megatrain computes for SentencePiece");
  refused(tiny_sp_tokenizer(pieces, {}, {{"type", "NFKC"}}, nullptr), "normalizer {\"type\":\"NFKC\"}");
  refused(tiny_sp_tokenizer(pieces, {}, kLlama2Normalizer, metaspace("first")), "a pre_tokenizer");
  // byte_fallback needs every byte's token.
  nlohmann::json j =
      nlohmann::json::parse(mt::read_text_file(tiny_sp_tokenizer(pieces, {}, kLlama2Normalizer, nullptr)));
  j["model"]["vocab"]["zz"] = j["model"]["vocab"]["<0x41>"];  // the id stays taken, by another piece
  j["model"]["vocab"].erase("<0x41>");
  const std::string path = tmp_dir() + "/no-byte.json";
  mt::write_file_atomic(path, j.dump());
  refused(path, "has no \"<0x41>\"");
}

TEST(HfTokenizer, WhatItCannotComputeIsRefusedByName) {
  auto refused = [](const nlohmann::json& tj, const std::string& part) {
    const std::string path = tmp_dir() + "/bad-tokenizer.json";
    mt::write_file_atomic(path, tj.dump());
    expect_refused(path, part);
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[mt::bytes_to_gpt2_text(std::string(1, static_cast<char>(b)))] = b;
  const nlohmann::json good = {{"added_tokens", {{{"id", 256}, {"content", "<|endoftext|>"}}}},
                               {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
                               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  {
    const std::string path = tmp_dir() + "/good-tokenizer.json";
    mt::write_file_atomic(path, good.dump());
    EXPECT_EQ(Tokenizer::load_hf(path).vocab_size(), 257);  // bytes only: every text encodes, byte by byte
  }
  nlohmann::json j = good;
  j["model"]["type"] = "Unigram";
  refused(j, "model.type is \"Unigram\"");
  j = good;
  j["normalizer"] = {{"type", "NFC"}};
  refused(j, "a normalizer");
  j = good;
  j["model"]["dropout"] = 0.1;
  refused(j, "model.dropout = 0.1");
  j = good;
  j["model"]["continuing_subword_prefix"] = "##";
  refused(j, "model.continuing_subword_prefix = \"##\"");
  j = good;
  j["model"]["byte_fallback"] = true;  // SentencePiece-style, which needs its own normalizer or pre-tokenizer
  refused(j, "not one megatrain computes for SentencePiece-style BPE");
  j = good;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  refused(j, "is not one megatrain computes");
  j = good;
  j["added_tokens"] = nlohmann::json::array();
  refused(j, "no end-of-text token");
  j = good;
  j["added_tokens"][0]["id"] = 300;
  refused(j, "not dense");
  j = good;
  j["model"]["merges"] = {"a b"};
  refused(j, "merge \"a b\" uses or makes a token missing from model.vocab");
}

}  // namespace
