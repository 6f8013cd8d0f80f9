// The update half of a training step, in two forms behind one interface: the plain optimizer (one replica per
// process, dp = 1) or ZeRO-2 DataParallel (gradients reduce-scattered in buckets during backward, sharded
// moments, parameters all-gathered after the step). The trainer's loop calls the same four things either way.
#pragma once
#include <functional>
#include <memory>

#include "megatrain/comm/process_group.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/train/model_stack.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

class Update {
 public:
  virtual ~Update() = default;
  // Called right before a backward that makes gradients final: the last micro-batch's backward of a step
  // (chunk = -1), or under pp the last backward of model chunk `chunk`. ZeRO starts reducing buckets from here.
  virtual void begin_last_backward(int chunk) = 0;
  // After the last backward: completes the gradients, turns `loss` (this replica's mean) into the mean over the
  // data-parallel replicas, and returns the global gradient norm.
  virtual double finish_gradients(float& loss) = 0;
  virtual void step(float lr, float grad_scale, int step) = 0;
  // Called with each flat range [begin, end) of the local gradients, final, right before its data-parallel
  // reduction (ZeRO-2: a bucket, maybe during the backward; dp = 1: the whole buffer, in finish_gradients, before
  // the norm): where sdcgrad corrupts a gradient (train/faults.h).
  virtual void set_before_reduce(std::function<void(size_t begin, size_t end)> f) = 0;
  // Waits for parameter traffic still in flight (before the final sample).
  virtual void sync_params() {}
  virtual CommTime take_comm_time() { return {}; }
  // For the checkpointer: exactly one of optimizer() and data_parallel() is set; expert_data_parallel() with
  // expert parallelism (the expert tensors' ZeRO-2 over the expert-dp group, beside data_parallel()'s dense ones).
  virtual Optimizer* optimizer() { return nullptr; }
  virtual DataParallel* data_parallel() { return nullptr; }
  virtual DataParallel* expert_data_parallel() { return nullptr; }
};

std::unique_ptr<Update> make_update(const RunConfig& cfg, Topology& topo, ModelStack& stack);

}  // namespace mt
