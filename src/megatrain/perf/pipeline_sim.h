// Event simulation of one training step of a pipeline: the action lists of the real Schedule (parallel/schedule.h,
// the ones the executor runs) with a cost per action, point-to-point transfers matched by message, and the data-
// parallel all-gathers / reduce-scatters of each model chunk on their own stream. No closed-form bubble: idle time
// is whatever the schedule's dependencies leave.
//
// Point-to-point, two modes. Overlapped (MegaScale §3.2, Figure 4): posting never blocks, a transfer starts once
// both ends have posted and lasts p2p_seconds, a wait returns when it is done (receives are posted one compute
// early by the schedule, so most transfers hide). Blocking (Megatron's send/receive on the compute stream): the
// sender is busy for the whole transfer at its post, the receiver issues its receive only when it needs the data
// and waits for the whole transfer then.
#pragma once
#include <vector>

#include "megatrain/parallel/schedule.h"

namespace mt::perf {

struct PipelineCosts {
  std::vector<double> fwd, bwd;  // per virtual stage: seconds of one micro-batch's forward / backward
  double p2p_seconds = 0;        // one activation or gradient message between neighbouring stages
  bool p2p_overlap = true;
  // Data parallel, per rank and chunk ([rank][chunk]); empty = no data-parallel traffic in the simulation.
  std::vector<std::vector<double>> dp_all_gather, dp_reduce_scatter;
  bool dp_prefetch_first = true;  // the first chunk's all-gather runs before the step (behind data loading)
};

struct PipelineResult {
  double makespan = 0;              // the step's pipeline phase: the last rank to finish (its reduce-scatters too)
  std::vector<double> busy;         // per rank: seconds of compute actions
  std::vector<double> finish;       // per rank: when its last action (or reduce-scatter) ended
  std::vector<int> peak_in_flight;  // per rank: most micro-batch chunks forwarded but not yet backwarded at once
};

// Throws mt::Error naming the rank and action on a broken schedule (a message without its partner, a deadlock) and
// when the costs do not fit the schedule (sizes, negative times).
PipelineResult simulate_pipeline(const Schedule& s, const PipelineCosts& costs);

}  // namespace mt::perf
