// A host copy of a device-resident model and its optimizer state, for the code that reads and writes them as host
// memory: checkpoints and weight import. The GPU trainer keeps one (16 bytes of host memory per parameter of this
// rank) and copies through it only around a save, a restore or an import, never inside a step. With data
// parallelism the optimizer moments are the DataParallel's slices, which it mirrors itself (moment_slices).
#pragma once
#include <memory>

#include "megatrain/kernels/ops.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

namespace mt {

class HostMirror {
 public:
  // The host model has device_model's layout: the same padding, tensor-parallel shards and pipeline part.
  // device_opt: the optimizer whose moments to mirror, or nullptr (data parallelism: the moments are sharded).
  HostMirror(GPT& device_model, Optimizer* device_opt, const OptimConfig& ocfg, size_t pad_multiple);
  GPT& model() { return host_; }
  Optimizer* optimizer() { return host_opt_.get(); }  // nullptr without a device optimizer
  // Device -> host: master weights and optimizer moments (e.g. before a checkpoint).
  void pull();
  // Host -> device, then the device's compute copy of the weights is refreshed (after a restore or an import).
  void push();

 private:
  std::unique_ptr<Ops> cpu_;
  GPT& dev_;
  Optimizer* dev_opt_;
  GPT host_;
  std::unique_ptr<Optimizer> host_opt_;
};

}  // namespace mt
