// The training loop, short enough to read top to bottom: build the model, optimizer and loaders; resume or
// initialise; then per step: micro-batches forward/backward, global-norm clipping, optimizer update, metrics,
// periodic validation and checkpoints; at the end a final checkpoint and a text sample.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "megatrain/comm/mesh.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"

namespace mt {

struct TrainResult {
  int first_step = 0;       // the first step this run executed (1, or the resumed step + 1)
  int last_step = 0;
  double first_loss = 0;    // training loss of the first and last executed steps
  double last_loss = 0;
  double last_val_loss = -1;
  std::string sample;       // decoded text sample (empty if disabled)
  std::string last_checkpoint;
};

// What run_training builds itself unless given (tests substitute them; see tests/train_planes_test.cpp).
struct TrainSeams {
  std::function<std::unique_ptr<Ops>()> make_ops;  // the backend (default: train.device's)
  // The groups of host memory (norms, losses, sampled ids, checkpoints; default: Gloo) and of the model's tensors
  // (buckets, activations, parameters; default: NCCL on GPU, the host groups themselves on the CPU).
  GroupFactory host_groups, data_groups;
};

// Runs the whole job described by cfg, printing progress to stdout.
TrainResult run_training(const RunConfig& cfg, const TrainSeams& seams = {});

}  // namespace mt
