// The parameter layout of a GPT: which tensors exist for a config, with the names and shapes of params.h, and
// (with tensor parallelism) how each is split over the tp ranks (Megatron):
//   column-parallel (rows chunked): c_attn (q | k | v parts), c_fc (gate | up parts for SwiGLU) and their biases;
//   row-parallel (columns chunked): attn.c_proj, mlp.c_proj weights (their biases replicated);
//   vocab-parallel (rows chunked): wte, lm_head, over padded_vocab(tp) rows;
//   replicated: norms, wpe;
// and with expert parallelism the MoE experts' tensors [E, ...] are split by expert over the ep ranks.
#pragma once
#include "megatrain/model/config.h"
#include "megatrain/model/params.h"

#include <utility>
#include <vector>

namespace mt {

// The part of the model one pipeline rank holds: model chunks (contiguous layer ranges, in increasing order), the
// embedding (stage 0) and the final norm + LM head (last stage). With tied embeddings the last stage holds its own
// copy of wte, declared after ln_f. The default is the whole model as one chunk.
struct GptPart {
  std::vector<std::pair<int, int>> chunks;  // [first, end) layer ranges; empty = all layers
  bool embedding = true, head = true;
  bool whole() const { return chunks.empty() && embedding && head; }
};

// The number of layers of each virtual stage (pp * virtual_stages of them, in stage order). `stage_layers` empty:
// an even split, which needs n_layer divisible by pp * virtual_stages. Given (parallel.stage_layers): one count per
// virtual stage, each >= 1, summing to n_layer; e.g. fewer layers on the last stage, which also computes the LM
// head and the loss, and on the first, which computes the embedding (Megatron's
// --decoder-first/last-pipeline-num-layers). Throws mt::Error naming the keys when the split is impossible.
std::vector<int> stage_layer_counts(const ModelConfig& cfg, int pp, int virtual_stages,
                                    const std::vector<int>& stage_layers = {});

// The part pipeline rank pp_rank holds with `virtual_stages` chunks per rank: chunk c is virtual stage
// c*pp + pp_rank, with the layers stage_layer_counts() gives it.
GptPart pipeline_part(const ModelConfig& cfg, int pp, int virtual_stages, int pp_rank,
                      const std::vector<int>& stage_layers = {});

// Declares every parameter of `cfg` in `store` (in forward order), as rank tp_rank's shards, and a MoE layer's expert
// tensors as ep rank ep_rank's experts (expert_spec); the caller then calls store.allocate(). tp_size = ep_size = 1
// is the single-process layout.
void declare_gpt_params(const ModelConfig& cfg, ParamStore& store, int tp_size = 1, int tp_rank = 0,
                        const GptPart& part = {}, int ep_size = 1, int ep_rank = 0);

}  // namespace mt
