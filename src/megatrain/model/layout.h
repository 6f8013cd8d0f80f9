// The parameter layout of a GPT: which tensors exist for a config, with the names and shapes of params.h, and
// (with tensor parallelism) how each is split over the tp ranks (Megatron):
//   column-parallel (rows chunked): c_attn (q | k | v parts), c_fc (gate | up parts for SwiGLU) and their biases;
//   row-parallel (columns chunked): attn.c_proj, mlp.c_proj weights (their biases replicated);
//   vocab-parallel (rows chunked): wte, lm_head, over padded_vocab(tp) rows;
//   replicated: norms, wpe.
#pragma once
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

namespace mt {

// Declares every parameter of `cfg` in `store` (in forward order), as rank tp_rank's shards; the caller then
// calls store.allocate(). tp_size = 1 is the single-process layout.
void declare_gpt_params(const ModelConfig& cfg, ParamStore& store, int tp_size = 1, int tp_rank = 0);

}  // namespace mt
