// The text sample at the end of a run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatrain/model/gpt.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

struct TextSample {
  std::string text;  // the prompt followed by the decoded continuation
  std::vector<int32_t> tokens;
};

// Every rank of the first dp replica takes part (its tp and pp groups run the model) and gets the sample; other
// ranks get nothing. Nothing either when sample.tokens = 0 or the model's vocabulary is not GPT-2's (said once).
std::optional<TextSample> final_sample(const RunConfig& cfg, GPT& model, Topology& topo);

}  // namespace mt
