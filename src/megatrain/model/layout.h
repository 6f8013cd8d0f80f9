// The parameter layout of a GPT: which tensors exist for a config, with the names and shapes of params.h.
#pragma once
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// Declares every parameter of `cfg` in `store` (in forward order); the caller then calls store.allocate().
void declare_gpt_params(const ModelConfig& cfg, ParamStore& store);

}  // namespace mt
