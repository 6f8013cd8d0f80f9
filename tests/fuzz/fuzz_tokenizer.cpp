// Fuzzes the tokenizer's files. Two kinds of input:
//   - GPT-2's encoder.json and vocab.bpe, as Tokenizer::load_gpt2 reads them: encoder.json, then a line
//     "#--vocab.bpe--", then vocab.bpe;
//   - an HF tokenizer.json, as Tokenizer::load_hf reads it: a first line "#tokenizer.json", the file, then a line
//     "#--text--" and a text to encode (byte-level BPE, or SentencePiece-style with byte fallback).
// A tokenizer the loader accepts must keep its documented promises: every id inside the vocabulary, and
// decode(encode(x)) == x for any bytes (decode_text for a SentencePiece-style one that prefixes every text).
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "megatrain/core/error.h"
#include "megatrain/tokenizer/tokenizer.h"

namespace {

constexpr std::string_view kHfMarker = "#tokenizer.json\n";

void fuzz_tokenizer_json(std::string_view input) {
  const std::vector<std::string_view> parts = mt::fuzz::split_input(input.substr(kHfMarker.size()), "#--text--", 2);
  const std::string path = mt::fuzz::write_scratch("tokenizer.json", parts[0]);
  FUZZ_ACCEPT_MT_ERRORS({
    const mt::Tokenizer tok = mt::Tokenizer::load_hf(path);
    FUZZ_CHECK(tok.eot() >= 0 && tok.eot() < tok.vocab_size(),
               fmt::format("eot {} of {}", tok.eot(), tok.vocab_size()));
    for (const std::vector<int32_t>* t : {&tok.template_prefix(), &tok.template_suffix()})
      for (int32_t id : *t) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), fmt::format("template id {}", id));
    const std::string text(parts[1]);
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = tok.encode(text, special);
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), fmt::format("id {} out of range", id));
      if (special) continue;  // specials' text may not round-trip (a SentencePiece prefix after each)
      if (!tok.sentencepiece()) {
        FUZZ_CHECK(tok.decode(ids) == text, "byte-level: decode(encode(x)) != x");
      } else if (tok.space_prefix() == mt::Tokenizer::SpacePrefix::Prepend) {
        // "▁" in the text decodes as a space (HF's decoders do the same): only texts without one round-trip.
        if (text.find("\u2581") == std::string::npos)
          FUZZ_CHECK(tok.decode_text(ids) == text, "SentencePiece: decode_text(encode(x)) != x");
      }
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.substr(0, kHfMarker.size()) == kHfMarker) {
    fuzz_tokenizer_json(input);
    return 0;
  }
  const std::vector<std::string_view> parts = mt::fuzz::split_input(input, "#--vocab.bpe--", 2);
  mt::fuzz::write_scratch("vocab/encoder.json", parts[0]);
  mt::fuzz::write_scratch("vocab/vocab.bpe", parts[1]);
  FUZZ_ACCEPT_MT_ERRORS({
    const mt::Tokenizer tok = mt::Tokenizer::load_gpt2(mt::fuzz::scratch_dir() + "/vocab");
    FUZZ_CHECK(tok.eot() >= 0 && tok.eot() < tok.vocab_size(),
               fmt::format("eot {} of {}", tok.eot(), tok.vocab_size()));
    // Text that meets every pre-token class, the special token, and bytes that are not UTF-8.
    const std::string text =
        "Hello world, it's 2024!  The  tokens'  merges\n\tare\r\n lower-ranked first.<|endoftext|>café \xff\xfe\xc3 z";
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = tok.encode(text, special);
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), fmt::format("id {} out of range", id));
      const std::string back = tok.decode(ids);
      FUZZ_CHECK(back == text, fmt::format("decode(encode(x)) != x (special {}): got \"{}\"", special, back));
    }
  });
  return 0;
}
