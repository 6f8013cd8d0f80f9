// The forward/backward half of a training step, in two forms behind one interface: plain (the whole model, or its
// tp shards, one micro-batch after another) or pipelined (this rank's stages run the schedule's actions over the
// step's micro-batches). Either way it accumulates the gradients of the step's mean loss into the model and
// tells the Update when gradients become final, so ZeRO can reduce them while backward goes on.
#pragma once
#include <memory>

#include "megatrain/comm/process_group.h"
#include "megatrain/data/loader.h"
#include "megatrain/train/model_stack.h"
#include "megatrain/train/topology.h"
#include "megatrain/train/update.h"

namespace mt {

class ForwardBackward {
 public:
  virtual ~ForwardBackward() = default;
  // train.grad_accum rounds of batches from `loader`: returns the step's mean loss over this replica's rows (the
  // same value on every rank of the replica).
  virtual float run(DataLoader& loader, Update& update) = 0;
  // Communication time since the last call: the tp group's collectives, and the pipeline's transfers.
  virtual CommTime take_tp_time() = 0;
  virtual CommTime take_pp_time() { return {}; }
};

std::unique_ptr<ForwardBackward> make_forward_backward(const RunConfig& cfg, Topology& topo, ModelStack& stack);

}  // namespace mt
