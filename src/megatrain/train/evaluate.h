// Validation loss of a model in any layout (see evaluate.cpp for which windows it reads).
#pragma once
#include "megatrain/model/gpt.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

// Collective over every rank of the job. Returns NaN when the val split has no batch; throws an mt::Error of kind
// NonFinite when the loss is not finite (a model that evaluates to inf/nan must not go on to be checkpointed).
double evaluate(GPT& model, const RunConfig& cfg, Topology& topo, int microbatches, int step);

}  // namespace mt
