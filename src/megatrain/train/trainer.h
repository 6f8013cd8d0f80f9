// The trainer: builds the job from its config with named builders (topology, model stack, update, forward/
// backward, checkpointer), resumes or initialises, runs the loop, and samples at the end. The loop is the same
// for every layout: forward/backward (plain or pipelined) and the update (plain or ZeRO-2) sit behind one
// interface each. What happens is reported to observers (train/observer.h).
#pragma once
#include <string>
#include <vector>

#include "megatrain/train/observer.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

struct TrainResult {
  int first_step = 0;  // the first step this run executed (1, or the resumed step + 1)
  int last_step = 0;
  double first_loss = 0;  // training loss of the first and last executed steps
  double last_loss = 0;
  double last_val_loss = -1;
  std::string sample;  // decoded text sample (empty if disabled)
  std::string last_checkpoint;
  bool stopped = false;  // a stop was requested (core/stop_request.h): the run ended early, after a step
};

// Runs the whole job described by cfg, printing progress to stdout on the main rank. `observers` get every event
// of this rank, after the built-in ones (the metrics log and the progress printer, on the main rank only). Errors
// are mt::Errors with a kind (core/error.h); observers see them (on_error) before they propagate.
TrainResult run_training(const RunConfig& cfg, const TrainSeams& seams = {},
                         const std::vector<TrainObserver*>& observers = {});

}  // namespace mt
