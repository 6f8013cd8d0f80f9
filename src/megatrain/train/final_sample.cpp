#include "megatrain/train/final_sample.h"

#include <fmt/format.h>

#include "megatrain/core/resources.h"
#include "megatrain/data/tokenizer.h"
#include "megatrain/train/sampler.h"

namespace mt {

std::optional<TextSample> final_sample(const RunConfig& cfg, GPT& model, Topology& topo) {
  if (cfg.sample.tokens <= 0 || topo.coord.dp != 0) return std::nullopt;
  Tokenizer tok = Tokenizer::load_gpt2(default_gpt2_vocab_dir());
  if (tok.vocab_size() != cfg.model.vocab_size) {
    if (topo.main_rank)
      fmt::print("(no sample: model.vocab_size {} is not the GPT-2 vocabulary's {})\n", cfg.model.vocab_size,
                 tok.vocab_size());
    return std::nullopt;
  }
  SampleOptions so{cfg.sample.tokens, cfg.sample.temperature, cfg.sample.top_k, cfg.sample.seed, tok.eot()};
  std::vector<int32_t> prompt = tok.encode(cfg.sample.prompt);
  if (prompt.empty()) prompt.push_back(tok.eot());
  DeviceMesh* host = topo.host_mesh.get();
  const bool tp = topo.shape.tp > 1, pp = topo.shape.pp > 1;
  TextSample s;
  s.tokens = sample_tokens(model, tp ? &host->tp() : nullptr, pp ? &host->pp() : nullptr, prompt, so,
                           pp ? &topo.device_mesh->pp() : nullptr);
  s.text = cfg.sample.prompt + tok.decode(s.tokens);
  return s;
}

}  // namespace mt
