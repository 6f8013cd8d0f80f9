// The forward/backward half of a training step, in two forms behind one interface: plain (the whole model, or its
// tp shards, one micro-batch after another) or pipelined (this rank's stages run the schedule's actions over the
// step's micro-batches). Either way it accumulates the gradients of the step's mean loss into the model and
// tells the Update when gradients become final, so ZeRO can reduce them while backward goes on.
//
// A step's batches are kept until the next step's run: rerun() feeds them again (the loader has moved on), for the
// rerun of a step whose loss or gradient norm spiked (train/sdc_rerun.h). A rerun is the same computation on the
// same data: deterministic kernels make it bit-identical unless the hardware erred.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "megatrain/comm/process_group.h"
#include "megatrain/data/loader.h"
#include "megatrain/train/model_stack.h"
#include "megatrain/train/observer.h"
#include "megatrain/train/topology.h"
#include "megatrain/train/update.h"

namespace mt {

class ForwardBackward {
 public:
  virtual ~ForwardBackward() = default;
  // train.grad_accum rounds of batches from `loader`: returns the step's mean loss over this replica's rows (the
  // same value on every rank of the replica). Keeps the batches for rerun().
  float run(DataLoader& loader, Update& update);
  // The last run() again, on the batches it read (the gradients must have been begun anew: ParamStore::begin_grads).
  float rerun(Update& update);
  // Communication time since the last call: the tp group's collectives, and the pipeline's transfers.
  virtual CommTime take_tp_time() = 0;
  virtual CommTime take_pp_time() { return {}; }
  // Time blocked on the data-parallel peers outside the Update's collectives since the last call (the coded form's
  // waits for a round's decision): counted with the dp plane's exposed time, so compute time stays compute.
  virtual CommTime take_dp_wait() { return {}; }
  // The step about to run (before run()): the coded form keys its round agreement and its faults by it.
  virtual void set_step(int /*step*/) {}
  // Straggler coding's account of the last run() (train/coded_forward_backward.h); none for the other forms.
  virtual std::optional<StragglerStepReport> take_straggler_report() { return std::nullopt; }

 protected:
  // The step's rounds: batch(i) is round i's batch (read from the loader, or the kept one).
  using BatchSource = std::function<const Batch&(int round)>;
  virtual float run_rounds(const BatchSource& batch, Update& update) = 0;
  bool rerunning() const { return rerunning_; }  // inside rerun()

 private:
  std::deque<Batch> kept_;  // the last run()'s batches, by round (a deque: a reference stays valid as it grows)
  bool rerunning_ = false;
};

std::unique_ptr<ForwardBackward> make_forward_backward(const RunConfig& cfg, Topology& topo, ModelStack& stack);

}  // namespace mt
