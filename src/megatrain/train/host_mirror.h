// A host copy of a device-resident model and its optimizer state, for the code that reads and writes them as host
// memory: checkpoints and weight import. The GPU trainer keeps one (a single process: 16 bytes of host memory per
// parameter) and copies through it only around a save, a restore or an import, never inside a step.
#pragma once
#include <memory>

#include "megatrain/kernels/ops.h"
#include "megatrain/model/gpt.h"
#include "megatrain/optim/optimizer.h"

namespace mt {

class HostMirror {
 public:
  // device_model must hold the whole model (no tensor or pipeline parallelism).
  HostMirror(GPT& device_model, Optimizer& device_opt, const OptimConfig& ocfg);
  GPT& model() { return host_; }
  Optimizer& optimizer() { return host_opt_; }
  // Device -> host: master weights and optimizer moments (e.g. before a checkpoint).
  void pull();
  // Host -> device, then the device's compute copy of the weights is refreshed (after a restore or an import).
  void push();

 private:
  std::unique_ptr<Ops> cpu_;
  GPT& dev_;
  Optimizer& dev_opt_;
  GPT host_;
  Optimizer host_opt_;
};

}  // namespace mt
