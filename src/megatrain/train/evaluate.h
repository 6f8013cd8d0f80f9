// Validation loss of a model in any layout (see evaluate.cpp for which windows it reads).
#pragma once
#include <vector>

#include "megatrain/model/gpt.h"
#include "megatrain/train/observer.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

// Collective over every rank of the job. Returns NaN when the val split has no batch; throws an mt::Error of kind
// NonFinite when the loss is not finite (a model that evaluates to inf/nan must not go on to be checkpointed).
// A blend (data.blend): each source's val split is evaluated on its own (train.eval_batches batches each, so K
// sources cost K evaluations), its loss put in *by_source when given, and the result is their mean weighted by the
// sources' shares.
double evaluate(GPT& model, const RunConfig& cfg, Topology& topo, int microbatches, int step,
                std::vector<SourceLoss>* by_source = nullptr);

// Throws an mt::Error of kind Data, naming the problem and the way out, when train.eval_every asks for evaluations
// that the val split cannot give (no val shards, too few tokens for one batch, a corrupt shard). The trainer calls
// it at start, so such a run fails before its first step rather than at its first evaluation, possibly hours in.
void check_val_split(const RunConfig& cfg, const Topology& topo, int microbatches);

}  // namespace mt
