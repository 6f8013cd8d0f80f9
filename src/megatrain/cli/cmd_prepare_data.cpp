// megatrain prepare-data: text, JSON-lines or the Brown corpus -> GPT-2 token shards (train/val) + meta.json.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "megatrain/cli/commands.h"
#include "megatrain/core/error.h"
#include "megatrain/data/assets.h"
#include "megatrain/data/prepare.h"
#include "megatrain/tokenizer/tokenizer.h"

namespace mt::cli {

int cmd_prepare_data(int argc, char** argv) {
  CLI::App app{"Tokenize a corpus into token shards (llm.c format) split into train and val.",
               "megatrain prepare-data"};
  PrepareOptions opt;
  std::string format = "text", preset, vocab = default_gpt2_vocab_dir();
  app.add_option("--input,-i", opt.inputs, "input files or directories (several allowed)");
  app.add_option("--format", format, "input format: brown | text (a file per document) | jsonl (a line per document)")
      ->check(CLI::IsMember({"brown", "text", "jsonl"}));
  app.add_option("--field", opt.field, "jsonl: the field holding the document's text")->capture_default_str();
  app.add_option("--preset", preset, "a known corpus: brown (the Brown corpus installed by scripts/setup)")
      ->check(CLI::IsMember({"brown"}));
  app.add_option("--out,-o", opt.out_dir, "output directory")->required();
  app.add_option("--vocab", vocab,
                 "the tokenizer: a directory with GPT-2's encoder.json and vocab.bpe, or an HF "
                 "tokenizer.json (byte-level BPE, e.g. Llama 3's) or its directory")
      ->capture_default_str();
  app.add_option("--val-fraction", opt.val_fraction, "fraction of documents for the val split, in [0, 1)")
      ->capture_default_str();
  app.add_option("--shard-tokens", opt.shard_tokens, "maximum tokens per shard")->capture_default_str();
  app.add_option("--seed", opt.seed, "seed of the train/val split")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (!preset.empty()) {
    MT_CHECK(opt.inputs.empty(), "--preset {} names its own input; drop --input", preset);
    MT_CHECK(app.count("--format") == 0 || format == "brown", "--preset brown reads the brown format, not {}", format);
    opt.inputs = {default_brown_dir()};
    format = "brown";
  }
  MT_CHECK(!opt.inputs.empty(), "no input: give --input PATH... or --preset brown");
  opt.format = parse_corpus_format(format);

  Tokenizer tok = Tokenizer::load(vocab);
  TokenEncoder enc;
  // allow_special = false: a document that happens to contain the text "<|endoftext|>" (or another special token's)
  // must not forge a document boundary. Each document is tokenized as HF's tokenizer(text) gives it, with its
  // template's special tokens (Llama's begin-of-text before it), except an end-of-text after it: the shard format's
  // end-of-text before each document already separates them.
  std::vector<int32_t> suffix = tok.template_suffix();
  if (suffix == std::vector<int32_t>{tok.eot()}) suffix.clear();
  enc.encode = [&tok, suffix](std::string_view s) {
    std::vector<int32_t> ids = tok.template_prefix();
    tok.encode_append(s, ids, /*allow_special=*/false);
    ids.insert(ids.end(), suffix.begin(), suffix.end());
    return ids;
  };
  enc.vocab_size = tok.vocab_size();
  enc.eot = tok.eot();
  enc.name = vocab;

  // A line every 10 s: a corpus of gigabytes takes minutes to hours, and silence looks like a hang.
  double last_line = 0;
  opt.on_progress = [&last_line](const PrepareProgress& p) {
    if (p.seconds - last_line < 10) return;
    last_line = p.seconds;
    fmt::print("{}\n", progress_line(p));
  };
  PrepareResult r = prepare_data(opt, enc);
  fmt::print("prepare-data: {} documents from {} file(s) -> {}: train {} docs / {} tokens ({} shard(s)), val {} docs / "
             "{} tokens ({} shard(s)){}, {:.1f} s\n",
             r.train.documents + r.val.documents, r.sources.size(), opt.out_dir, r.train.documents, r.train.tokens,
             r.train.shards.size(), r.val.documents, r.val.tokens, r.val.shards.size(),
             r.skipped_empty ? fmt::format(", {} empty skipped", r.skipped_empty) : std::string(), r.seconds);
  return 0;
}

}  // namespace mt::cli
