// The slowburst faults (MEGATRAIN_FAULTS, core/fault_spec.h) of one data-parallel replica: in which rounds of which
// step it is slow, and by what factor. A round is a micro-batch round of the step as the step runs it: under
// parallel.straggler_coding the code's rounds (train/coded_forward_backward.h), else the train.grad_accum
// micro-batch rounds of the plain and pipelined forward/backward (train/forward_backward.cpp), so the same fault
// slows an uncoded run too and the two can be compared. A bursty item (b, w, lambda) takes this replica's column of
// the generator's pattern over the replicas and the run's rounds (parallel/straggler_model.h), the same on every
// rank; a `rounds=` item names (step, round) pairs.
#pragma once
#include <vector>

#include "megatrain/core/fault_spec.h"
#include "megatrain/parallel/straggler_model.h"

namespace mt {

class SlowRounds {
 public:
  // rank: this process (faults name ranks); replica: its dp coordinate among `workers` replicas; rounds_per_step:
  // the rounds a step runs; steps: train.steps (the pattern's length).
  SlowRounds(int rank, int replica, int workers, int rounds_per_step, int steps);
  // The sleep factor of (step, round): > 1 when a fault makes it slow; prints the fault line when `fires` (the
  // replica has the compute history the sleep is measured by), else returns 1.
  double factor(int step, int round, bool fires) const;
  bool any() const { return !items_.empty(); }

 private:
  struct Item {
    Fault f;
    StragglerPattern pattern;
  };
  std::vector<Item> items_;
  int rank_, replica_, per_step_;
};

}  // namespace mt
