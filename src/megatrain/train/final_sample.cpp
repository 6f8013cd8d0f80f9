#include "megatrain/train/final_sample.h"

#include <fmt/format.h>

#include <filesystem>

#include "megatrain/data/assets.h"
#include "megatrain/data/prepare.h"
#include "megatrain/tokenizer/tokenizer.h"
#include "megatrain/train/sampler.h"

namespace mt {

namespace {

// sample.tokenizer when set (checked at config load); else the one the training data was prepared with, which is
// what the model learned; else GPT-2's. "" with a note when the recorded one is gone.
std::string sample_tokenizer_dir(const RunConfig& cfg, bool say) {
  if (!cfg.sample.tokenizer.empty()) return cfg.sample.tokenizer;
  const std::string data = cfg.data.sources()[0].dir;  // a blend's sources share one vocabulary (the loader checks)
  const std::string recorded = prepared_tokenizer(data);
  if (recorded.empty()) return default_gpt2_vocab_dir();
  if (Tokenizer::missing_files(recorded).empty()) return recorded;
  if (say)
    fmt::print("(no sample: {}/meta.json names the tokenizer {}, which is not here; set sample.tokenizer)\n", data,
               recorded);
  return "";
}

}  // namespace

std::optional<TextSample> final_sample(const RunConfig& cfg, GPT& model, Topology& topo) {
  // The first dp replica samples; with expert parallelism its whole ep group (the ranks holding the other experts).
  if (cfg.sample.tokens <= 0 || topo.coord.dp >= topo.shape.ep) return std::nullopt;
  const std::string dir = sample_tokenizer_dir(cfg, topo.main_rank);
  if (dir.empty()) return std::nullopt;
  Tokenizer tok = Tokenizer::load(dir);
  if (tok.vocab_size() != cfg.model.vocab_size) {
    if (topo.main_rank)
      fmt::print("(no sample: model.vocab_size {} is not the vocabulary size {} of the tokenizer {})\n",
                 cfg.model.vocab_size, tok.vocab_size(), dir);
    return std::nullopt;
  }
  SampleOptions so{cfg.sample.tokens, cfg.sample.temperature, cfg.sample.top_k, cfg.sample.seed, tok.eot()};
  std::vector<int32_t> prompt = tok.template_prefix();  // as generate: Llama's <s> first
  tok.encode_append(cfg.sample.prompt, prompt);
  if (prompt.empty()) prompt.push_back(tok.eot());
  DeviceMesh* host = topo.host_mesh.get();
  const bool tp = topo.shape.tp > 1, pp = topo.shape.pp > 1;
  TextSample s;
  s.tokens = sample_tokens(model, tp ? &host->tp() : nullptr, pp ? &host->pp() : nullptr, prompt, so,
                           pp ? &topo.device_mesh->pp() : nullptr, topo.shape.ep > 1 ? &host->ep() : nullptr);
  s.text = cfg.sample.prompt + tok.decode(s.tokens);
  return s;
}

}  // namespace mt
