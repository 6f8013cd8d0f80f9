// megatrain tokenize encode|decode|train: the GPT-2 BPE tokenizer on files or stdin/stdout.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"
#include "megatrain/data/assets.h"
#include "megatrain/tokenizer/bpe_train.h"
#include "megatrain/tokenizer/tokenizer.h"

namespace mt::cli {

namespace {

std::string read_input(const std::string& path) {
  if (path != "-") return read_text_file(path);
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

void write_output(const std::string& path, const std::string& data) {
  if (path != "-") return write_file_atomic(path, data);
  MT_CHECK(std::fwrite(data.data(), 1, data.size(), stdout) == data.size() && std::fflush(stdout) == 0,
           "cannot write to stdout");
}

std::string ids_to_bytes(const std::vector<int32_t>& ids, const std::string& format) {
  std::string out;
  if (format == "text") {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    return out + '\n';
  }
  const int width = format == "u16" ? 2 : 4;
  out.reserve(ids.size() * width);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = static_cast<uint32_t>(ids[i]);
    MT_CHECK(width == 4 || id <= 0xFFFF, "token id {} at position {} does not fit in u16; use --format u32", id, i);
    for (int b = 0; b < width; ++b) out += static_cast<char>(id >> (8 * b) & 0xFF);  // little-endian
  }
  return out;
}

std::vector<int32_t> bytes_to_ids(const std::string& in, const std::string& format) {
  std::vector<int32_t> ids;
  if (format == "text") {
    size_t i = 0;
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ','; };
    while (i < in.size()) {
      while (i < in.size() && space(in[i])) ++i;
      size_t j = i;
      while (j < in.size() && !space(in[j])) ++j;
      if (j == i) break;
      std::string tok = in.substr(i, j - i);
      size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(tok, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MT_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, "input is not a list of token ids: \"{}\" at byte {}",
               tok.substr(0, 40), i);
      ids.push_back(static_cast<int32_t>(v));
      i = j;
    }
    return ids;
  }
  const size_t width = format == "u16" ? 2 : 4;
  MT_CHECK(in.size() % width == 0, "{}-byte input is not a whole number of {} ids", in.size(), format);
  ids.reserve(in.size() / width);
  for (size_t i = 0; i < in.size(); i += width) {
    uint32_t v = 0;
    for (size_t b = 0; b < width; ++b) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[i + b])) << (8 * b);
    MT_CHECK(v <= INT32_MAX, "token id {} at position {} is out of range", v, i / width);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Encode/decode text with GPT-2's byte-level BPE or an HF tokenizer.json (byte-level or "
               "SentencePiece-style: Llama 2 and 3, Mistral), or train a BPE vocabulary.",
               "megatrain tokenize"};
  app.require_subcommand(1);

  std::string vocab = default_gpt2_vocab_dir(), in = "-", out = "-", format = "text";
  bool no_special = false, with_template = false;
  auto add_io = [&](CLI::App* c) {
    c->add_option("--vocab", vocab,
                  "GPT-2's encoder.json and vocab.bpe directory, or an HF tokenizer.json (or its directory)")
        ->capture_default_str();
    c->add_option("--in", in, "input file, - for stdin")->capture_default_str();
    c->add_option("--out", out, "output file, - for stdout")->capture_default_str();
    c->add_option("--format", format, "ids as text (one line, space separated) or little-endian u16/u32")
        ->check(CLI::IsMember({"text", "u16", "u32"}))
        ->capture_default_str();
  };
  CLI::App* enc = app.add_subcommand("encode", "text -> token ids");
  add_io(enc);
  enc->add_flag("--no-special", no_special, "treat \"<|endoftext|>\" as plain text, not the end-of-text token");
  enc->add_flag("--with-template", with_template,
                "add the special tokens the tokenizer.json's post-processor puts "
                "around a text (Llama's <s> first), as HF's tokenizer(text) does");
  CLI::App* dec = app.add_subcommand("decode", "token ids -> text");
  add_io(dec);

  std::vector<std::string> train_in;
  int vocab_size = 0;
  std::string train_out;
  int64_t min_count = BpeTrainOptions{}.min_pair_count;
  CLI::App* train = app.add_subcommand("train", "learn a BPE vocabulary (GPT-2 format) from text files");
  train->add_option("--in", train_in, "text files (each one a document)")
      ->required()
      ->expected(1, -1)
      ->check(CLI::ExistingFile);
  train->add_option("--vocab-size", vocab_size, "tokens in the vocabulary, <|endoftext|> included")
      ->required()
      ->check(CLI::Range(257, 1 << 24));
  train->add_option("--out", train_out, "directory to write encoder.json and vocab.bpe to")->required();
  train->add_option("--min-count", min_count, "stop when the most frequent pair occurs fewer times")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError too
  }

  if (*enc) {
    Tokenizer tok = Tokenizer::load(vocab);
    std::vector<int32_t> ids = with_template ? tok.template_prefix() : std::vector<int32_t>{};
    tok.encode_append(read_input(in), ids, !no_special);
    if (with_template) ids.insert(ids.end(), tok.template_suffix().begin(), tok.template_suffix().end());
    write_output(out, ids_to_bytes(ids, format));
  } else if (*dec) {
    Tokenizer tok = Tokenizer::load(vocab);
    write_output(out, tok.decode_text(bytes_to_ids(read_input(in), format)));
  } else if (*train) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (const auto& f : train_in) {
      texts.push_back(read_text_file(f));
      bytes += texts.back().size();
    }
    BpeTrainOptions opt;
    opt.min_pair_count = min_count;
    BpeVocab v = train_bpe(texts, vocab_size, opt);
    write_gpt2_vocab(v, train_out);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "tokenize train: %zu tokens (%zu merges) from %zu bytes in %.2f s -> %s\n", v.tokens.size(),
                 v.merges.size(), bytes, s, train_out.c_str());
    if (static_cast<int>(v.tokens.size()) < vocab_size)
      std::fprintf(stderr, "tokenize train: note: stopped below --vocab-size %d: no pair occurs %lld+ times\n",
                   vocab_size, static_cast<long long>(min_count));
  }
  return 0;
}

}  // namespace mt::cli
