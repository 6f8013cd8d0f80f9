// Fuzzes the tokenizer's files (GPT-2's encoder.json and vocab.bpe, as Tokenizer::load_gpt2 reads them): the input
// is encoder.json, then a line "#--vocab.bpe--", then vocab.bpe. A vocabulary the loader accepts must keep the
// tokenizer's documented promise: decode(encode(x)) == x for any bytes, with every id inside the vocabulary.
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "megatrain/core/error.h"
#include "megatrain/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
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
