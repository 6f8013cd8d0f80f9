// Text generation from a GPT: temperature and top-k sampling, no KV cache (the CPU reference re-runs the window;
// fine for samples of a few hundred tokens). Works for the whole model in one process and for a model split
// over tensor- and pipeline-parallel groups, with the same tokens for the same seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megatrain/core/rng.h"
#include "megatrain/comm/process_group.h"
#include "megatrain/model/gpt.h"

namespace mt {

struct SampleOptions {
  int tokens = 64;
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = the whole vocabulary
  uint64_t seed = 7;
  int stop_token = -1;  // stop when sampled (e.g. EOT); -1 = never
};

// Picks tokens from rows of logits: greedy, or temperature + top-k drawing from its own generator (seeded with
// o.seed), so a sequence of picks depends only on the rows and the options.
class TokenPicker {
 public:
  TokenPicker(int vocab_size, const SampleOptions& o);
  int pick(const float* row);  // row: logits of ids [0, vocab_size)

 private:
  int vocab_;
  SampleOptions o_;
  Rng rng_;
  std::vector<std::pair<float, int>> cand_;
};

// Continues `prompt` (token ids, non-empty) and returns only the new ids.
std::vector<int32_t> sample_tokens(GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& o);

// The same with the model split over groups (nullptr or size 1: not split along that dimension): every rank of
// the model's tp x pp groups calls it with the same arguments and all return the same ids. With tp the last
// position's vocabulary columns are all-gathered and every tp rank picks the same token; with pp the last stage
// picks and broadcasts it to the other stages. With tp the window is padded on the right to a multiple of tp
// (causal attention: the padding does not change the logits of the positions before it).
// tp and pp move host memory (the picked ids, the gathered logit row); pp_data, when set, is the pp group the
// activations move over (a GPU run's NCCL group; nullptr: pp itself). ep: expert parallelism's group (its ranks hold
// different experts, so every one of them runs each forward): its rank 0 picks and broadcasts the token.
std::vector<int32_t> sample_tokens(GPT& model, ProcessGroup* tp, ProcessGroup* pp, const std::vector<int32_t>& prompt,
                                   const SampleOptions& o, ProcessGroup* pp_data = nullptr, ProcessGroup* ep = nullptr);

}  // namespace mt
