// megatrain generate --ckpt DIR --prompt "..." [--tokens N] [--temperature T] [--top-k K] [--seed S]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "megatrain/ckpt/checkpoint.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/cli/commands.h"
#include "megatrain/data/assets.h"
#include "megatrain/tokenizer/tokenizer.h"
#include "megatrain/model/gpt.h"
#include "megatrain/train/sampler.h"

namespace mt::cli {

int cmd_generate(int argc, char** argv) {
  CLI::App app{
      "Sample text from a checkpoint (a training run's ckpt dir, a step dir, `convert --from-hf` output) or an "
      "HF GPT-2 or Llama model",
      "generate"};
  std::string ckpt, prompt = "\n", vocab = default_gpt2_vocab_dir();
  SampleOptions o;
  o.tokens = 100;
  app.add_option(
         "--ckpt", ckpt,
         "checkpoint directory (root with `latest`, or one step_N directory), or an HF model (directory or file)")
      ->required();
  app.add_option("--prompt", prompt, "text to continue");
  app.add_option("--tokens", o.tokens, "number of tokens to sample")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", o.temperature, "softmax temperature; 0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens; 0 = all")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "sampling seed");
  app.add_option("--vocab", vocab,
                 "the tokenizer: GPT-2's encoder.json and vocab.bpe directory, or an HF tokenizer.json");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ModelConfig cfg = model_config_of(ckpt);
  cfg.recompute.clear();
  auto ops = make_cpu_ops();
  GPT model(cfg, *ops);
  load_model_weights(ckpt, cfg, model.params());
  Tokenizer tok = Tokenizer::load(vocab);
  MT_CHECK(tok.vocab_size() == cfg.vocab_size, "the tokenizer in {} has {} tokens but the model has {}", vocab,
           tok.vocab_size(), cfg.vocab_size);
  std::vector<int32_t> ids = tok.template_prefix();  // a text starts as the tokenizer's models saw it (Llama: <s>)
  tok.encode_append(prompt, ids);
  if (ids.empty()) ids.push_back(tok.eot());
  o.stop_token = tok.eot();
  std::vector<int32_t> out = sample_tokens(model, ids, o);
  fmt::print("{}{}\n", prompt, tok.decode(out));
  return 0;
}

}  // namespace mt::cli
