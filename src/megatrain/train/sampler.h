// Text generation from a GPT: temperature and top-k sampling, no KV cache (the CPU reference re-runs the window;
// fine for samples of a few hundred tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megatrain/model/gpt.h"

namespace mt {

struct SampleOptions {
  int tokens = 64;
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = the whole vocabulary
  uint64_t seed = 7;
  int stop_token = -1;       // stop when sampled (e.g. EOT); -1 = never
};

// Continues `prompt` (token ids, non-empty) and returns only the new ids.
std::vector<int32_t> sample_tokens(GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& o);

}  // namespace mt
