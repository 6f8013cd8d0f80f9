// Fuzzes the run configuration as `megatrain train --config FILE --section.key=value ...` reads it: the input is
// the TOML file, then a line "#--overrides--", then one command-line override per line. An accepted config must
// also survive what every run does next with it: compute the model's derived sizes (no integer overflow), and save
// its model section into a checkpoint manifest that reads back as the same model (or `generate` and resume fail).
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "megatrain/ckpt/config_json.h"
#include "megatrain/core/error.h"
#include "megatrain/train/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string_view> parts = mt::fuzz::split_input(input, "#--overrides--", 2);
  const std::string path = mt::fuzz::write_scratch("run.toml", parts[0]);
  std::vector<std::string> overrides;
  for (size_t p = 0; p < parts[1].size();) {
    size_t nl = parts[1].find('\n', p);
    if (nl == std::string_view::npos) nl = parts[1].size();
    if (nl > p) overrides.emplace_back(parts[1].substr(p, nl - p));
    p = nl + 1;
  }
  FUZZ_ACCEPT_MT_ERRORS({
    const mt::RunConfig cfg = mt::load_run_config(path, overrides);
    const mt::ModelConfig& m = cfg.model;
    // What start-up computes from an accepted config (UBSan reports any signed overflow here).
    (void)m.padded_vocab();
    (void)m.padded_vocab(cfg.parallel.tp);
    (void)m.num_params();
    (void)m.flops_per_token(cfg.data.seq_len);
    (void)cfg.pipeline_microbatches();
    // A checkpoint records the model as JSON; what a run accepted, a resume must accept as the same model.
    const nlohmann::json saved = mt::model_config_to_json(m);
    nlohmann::json reread;
    try {
      reread = mt::model_config_to_json(mt::model_config_from_json(saved));
    } catch (const mt::Error& e) {
      FUZZ_CHECK(false, fmt::format("a checkpoint of this run could not be read back: {}", e.what()));
    }
    FUZZ_CHECK(saved == reread,
               fmt::format("model config changed through a manifest: {} -> {}", saved.dump(), reread.dump()));
  });
  return 0;
}
