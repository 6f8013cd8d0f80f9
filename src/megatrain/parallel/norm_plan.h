// How squared norms are summed over the model-parallel ranks, decided once per layout.
//
// A rank holds part of the model: its tp shards (sharded tensors split, replicated ones copied on every tp rank)
// of its pipeline stages. Two kinds of norms need the whole model:
// - per-tensor norms (LAMB's trust ratios): a tensor lives in one stage, so they sum over tp only, counting a
//   replicated tensor once (weight 1 on tp rank 0, 0 elsewhere);
// - the global gradient norm (clipping) sums over tp and over the pipeline stages, counting the last stage's copy
//   of a tied embedding zero times (the first stage's copy holds the same summed gradient).
// The plan holds both weightings and reductions; the optimizer paths (Optimizer, DataParallel) only apply them.
#pragma once
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/model/params.h"
#include "megatrain/optim/optimizer.h"

namespace mt {

struct NormPlan {
  // Per-tensor squared norms: weights (empty: all 1) and the sum over tp (empty: none, tp = 1).
  std::vector<float> tensor_weights;
  NormReduce tensor_reduce;
  // The global norm, when it reduces differently from the per-tensor norms (pp > 1); empty otherwise, and the
  // global norm then uses tensor_weights / tensor_reduce.
  std::vector<float> clip_weights;
  NormReduce clip_reduce;

  // The global gradient norm of params (this rank's part) under the plan: collective over the groups it reduces.
  double global_norm(Ops& ops, const ParamStore& params) const;
};

// tp_group / pp_group: this rank's host-memory groups (the norms are host scalars); wte_copy: the parameter index
// of the last stage's copy of a tied embedding, or -1. The groups must outlive the plan.
NormPlan make_norm_plan(const ParamStore& params, ProcessGroup* tp_group, ProcessGroup* pp_group, int wte_copy);

}  // namespace mt
