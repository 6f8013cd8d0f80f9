// megatrain eval --ckpt DIR --data DIR [--data DIR ...] [--split val] [--batches N] [--batch-size B] [--seq-len T]
// The loss of a checkpoint, or of an HF model, on prepared data: one process on the CPU, the windows the trainer's
// evaluation reads (unshuffled, from the split's start), its arithmetic (the mean over batches of each batch's mean
// loss). The sanity check after an import ("does this Llama read my data as it should?") and a way to compare
// checkpoints on data they were not evaluated on.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "megatrain/ckpt/model_weights.h"
#include "megatrain/cli/commands.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/data/loader.h"
#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/model/gpt.h"

namespace mt::cli {

int cmd_eval(int argc, char** argv) {
  CLI::App app{"The loss of a checkpoint (or an HF GPT-2 or Llama model) on prepared data: the windows and the "
               "arithmetic of the trainer's evaluation, in one process on the CPU",
               "eval"};
  std::string ckpt, split = "val";
  std::vector<std::string> dirs;
  int batches = 8, B = 8, T = 0, threads = 0;
  bool json = false;
  app.add_option("--ckpt", ckpt,
                 "checkpoint directory (root with `latest`, or one step_N directory), or an HF model "
                 "(directory or file)")
      ->required();
  app.add_option("--data", dirs, "prepared data directories (prepare-data output); each is evaluated on its own")
      ->required()
      ->expected(1, -1);
  app.add_option("--split", split, "which split's shards to read")->capture_default_str();
  app.add_option("--batches", batches, "batches per directory (fewer when the split has fewer)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", B, "sequences per batch")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seq-len", T, "tokens per sequence (0: the model's context, at most 1024)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "OpenMP threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--json", json, "one JSON object per directory instead of a line for people");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  ModelConfig cfg = model_config_of(ckpt);
  cfg.recompute.clear();
  if (T == 0) T = std::min(cfg.max_seq_len, 1024);
  MT_CHECK(T <= cfg.max_seq_len, "--seq-len {} exceeds the model's context of {} tokens", T, cfg.max_seq_len);
  auto ops = make_cpu_ops();
  GPT model(cfg, *ops);
  load_model_weights(ckpt, cfg, model.params());
  for (const std::string& dir : dirs) {
    const double t0 = now_seconds();
    DataLoader dl(dir, split, B, T, /*shuffle=*/false, 0, 0, 1, /*prefetch=*/0, cfg.vocab_size);
    MT_CHECK(dl.vocab_size() <= cfg.vocab_size,
             "{}: its shards use a vocabulary of {} tokens but the model has {}: "
             "they were prepared with another tokenizer",
             dir, dl.vocab_size(), cfg.vocab_size);
    const int n = static_cast<int>(std::min<uint64_t>(batches, dl.batches_per_epoch()));
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const Batch b = dl.next();
      sum += model.forward(b.x.data(), b.y.data(), B, T, /*train=*/false);
    }
    const double loss = sum / n;
    MT_CHECK(std::isfinite(loss), "{}: the loss is not finite ({})", dir, loss);
    const int64_t tokens = int64_t{n} * B * T;
    if (json) {
      fmt::print("{}\n", nlohmann::json{{"dir", dir},
                                        {"split", split},
                                        {"loss", loss},
                                        {"perplexity", std::exp(loss)},
                                        {"batches", n},
                                        {"batch_size", B},
                                        {"seq_len", T},
                                        {"tokens", tokens},
                                        {"seconds", now_seconds() - t0}}
                             .dump());
    } else {
      fmt::print("{} ({}): loss {:.4f}, perplexity {:.2f}, over {} batches of {} x {} tokens ({:.1f} s)\n", dir, split,
                 loss, std::exp(loss), n, B, T, now_seconds() - t0);
    }
  }
  return 0;
}

}  // namespace mt::cli
