// megatrain convert: HF GPT-2 and Llama (Mistral, Mixtral) models <-> megatrain checkpoint directories.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "megatrain/ckpt/model_weights.h"
#include "megatrain/ckpt/reader.h"
#include "megatrain/cli/commands.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/tokenizer/hf_tokenizer_files.h"
#include "megatrain/data/prepare.h"

namespace mt::cli {

namespace {

// The tokenizer checkpoint `ckpt` was trained with: its training data's (extra.data.dir) meta.json records it. ""
// when the checkpoint or the data does not say (a converted HF model, data moved away).
std::string tokenizer_of_training_data(const std::string& ckpt) {
  try {
    const CheckpointReader ck = CheckpointReader::open(ckpt, /*verify_checksums=*/false);
    const nlohmann::json& d = ck.extra().contains("data") ? ck.extra()["data"] : nlohmann::json();
    if (!d.is_object() || !d.contains("dir") || !d["dir"].is_string()) return "";
    return prepared_tokenizer(d["dir"].get<std::string>());
  } catch (const Error&) {
    return "";
  }
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  CLI::App app{"Convert HF GPT-2 or Llama weights to a megatrain checkpoint (--from-hf) or back (--to-hf).\n"
               "  megatrain convert --from-hf HF_MODEL --out CKPT_DIR [--n-head N]\n"
               "      HF_MODEL: a model directory (config.json + model.safetensors or model.safetensors.index.json),\n"
               "      its .safetensors file or its index\n"
               "  megatrain convert --to-hf CKPT_DIR --out model.safetensors [--dtype bf16] [--tokenizer PATH|none]\n"
               "      (config.json and the tokenizer's files beside it; GPT-2 or Llama, whichever layout the\n"
               "      checkpoint's model has)",
               "megatrain convert"};
  std::string from_hf, to_hf, out;
  int n_head = 0;
  auto* from = app.add_option("--from-hf", from_hf, "HF GPT-2 or Llama model to import (directory, file or index)");
  auto* to = app.add_option("--to-hf", to_hf, "checkpoint (root or step directory) to export");
  from->excludes(to);
  app.add_option("--out,-o", out, "--from-hf: checkpoint root to create; --to-hf: .safetensors file to write")
      ->required();
  app.add_option("--n-head", n_head,
                 "--from-hf, GPT-2: attention heads (shapes cannot tell; default: config.json beside the file, else "
                 "width/64); a Llama's config.json always gives them");
  std::string dtype = "f32";
  app.add_option("--dtype", dtype,
                 "--to-hf: f32 (exact, the default) or bf16 (half the bytes, rounded to nearest even)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  std::string tokenizer;
  app.add_option("--tokenizer", tokenizer,
                 "--to-hf: the tokenizer to write beside the model, in HF's file names "
                 "(default: the one the checkpoint's training data was prepared with, from its meta.json; none: no "
                 "tokenizer files)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_CHECK(!from_hf.empty() || !to_hf.empty(), "say what to convert: --from-hf FILE or --to-hf CKPT_DIR");
  MT_CHECK(n_head == 0 || !from_hf.empty(), "--n-head applies to --from-hf only");
  MT_CHECK(dtype == "f32" || !to_hf.empty(), "--dtype applies to --to-hf only (--from-hf reads F32, F16 and BF16)");
  MT_CHECK(tokenizer.empty() || !to_hf.empty(), "--tokenizer applies to --to-hf only");

  double t0 = now_seconds();
  if (!from_hf.empty()) {
    std::string dir = convert_hf_to_checkpoint(from_hf, out, n_head);
    ModelConfig cfg = model_config_of(dir);
    fmt::print("convert: {} -> {} (n_layer {}, n_head {}, d_model {}, vocab {}, {} params), {:.1f} s\n", from_hf, dir,
               cfg.n_layer, cfg.n_head, cfg.d_model, cfg.vocab_size, cfg.num_params(), now_seconds() - t0);
  } else {
    // The tokenizer first: a wrong one is refused before any file of the export is written.
    std::string tok_from = tokenizer, tok_note;
    if (tok_from.empty()) {
      tok_from = tokenizer_of_training_data(to_hf);
      if (tok_from.empty()) tok_note = "; no tokenizer written (the checkpoint's data records none: pass --tokenizer)";
    }
    if (tok_from == "none") tok_from.clear();
    if (!tok_from.empty() && tokenizer.empty()) {  // the recorded one: skipped with a note if it does not fit
      try {
        check_tokenizer_of_model(tok_from, model_config_of(to_hf).vocab_size);
      } catch (const Error& e) {
        tok_note = fmt::format("; no tokenizer written ({}: pass --tokenizer)", e.what());
        tok_from.clear();
      }
    } else if (!tok_from.empty()) {
      check_tokenizer_of_model(tok_from, model_config_of(to_hf).vocab_size);
    }
    ModelConfig cfg = convert_checkpoint_to_hf(to_hf, out, dtype == "bf16" ? DType::BF16 : DType::F32);
    if (!tok_from.empty()) {
      const std::string dir = std::filesystem::path(out).parent_path().string();
      const std::vector<std::string> files = write_hf_tokenizer_files(tok_from, dir.empty() ? "." : dir,
                                                                      cfg.vocab_size);
      tok_note = fmt::format("; tokenizer {} as {}", tok_from, fmt::join(files, ", "));
    }
    fmt::print("convert: {} -> {} + config.json ({}, n_layer {}, n_head {}, d_model {}, vocab {}, {}){}, {:.1f} s\n",
               to_hf, out,
               cfg.moe()                       ? "Mixtral"
               : cfg.norm == NormKind::RmsNorm ? "Llama"
                                               : "GPT-2",
               cfg.n_layer, cfg.n_head, cfg.d_model, cfg.vocab_size, dtype, tok_note, now_seconds() - t0);
  }
  return 0;
}

}  // namespace mt::cli
