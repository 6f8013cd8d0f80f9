// The rerun of a step whose loss or gradient norm spiked (train.sdc_rerun_on_spike; docs/robust-training.md): the
// silent-data-corruption check for transient faults, which the replicas' parameter comparison (train/sdc_check.h)
// cannot see. A fault in one rank's gradients reaches every replica through the data-parallel reduction, so the
// replicas still agree afterwards; but a rank that computes the same step again on the same data gets the same bits
// (the kernels are deterministic) unless its hardware erred, so a rank that does not reproduce its own gradients is
// the one that erred.
//
// Protocol (collective over every rank, after the step's gradients are reduced and its global gradient norm is
// known, before its optimizer update):
//  1. the trigger: two spike detectors (train/loss_spike.h), both with the train.spike_* rule: one over the step's
//     loss (the replicas' mean), one over its global gradient norm. Every rank observes the same two values, yet the
//     trigger is agreed (comm/agreement.h any_rank): a rank that reran alone would leave the others waiting in its
//     collectives;
//  2. each rank hashes its local gradients, tensor by tensor (train/sdc_verdict.h param_hash): what its own
//     backward produced. They survive the reduction: ZeRO-2 reduce-scatters them into a separate shard buffer and
//     only reads them (Gloo's ring, NCCL, the staged group alike). Left out (hashed as 0): the gradients a collective
//     sums in place during the backward, under tp the replicated tensors' and under pp with a tied embedding the wte
//     copy's: a fault there is every peer's, and would name them all;
//  3. the rerun: the gradients are begun anew, the step's forward and backward run again on its kept batches
//     (train/forward_backward.h), then the reduction and the norm as in the first pass; each rank hashes its local
//     gradients again;
//  4. judge_rerun on each rank; the ranks agree which did not reproduce (which_ranks). Each of those sends
//       sdc {"step":S,"tensor":NAME,"transient":true,"node":N,"trigger":"loss"|"grad_norm",
//            "first":"<hex>","rerun":"<hex>"}
//     (the event log: a fault with reason sdc and that rank) and every rank fails with ErrorKind::Sdc before the
//     update: the corrupted gradients never reach the parameters, no checkpoint holds them, and the supervisor's
//     restart resumes from the newest checkpoint (each one written after a replica check that agreed), where a
//     transient fault does not recur. One such fault does not evict the node; named again in a later attempt it
//     does (launch/sdc_strikes.h);
//  5. reproduced on every rank: not silent data corruption. The rerun's reduced gradients and norm are then the
//     first pass's bit for bit (the same inputs to the same collectives), and the step goes on to its update; rank 0
//     sends
//       sdc_rerun {"step":S,"trigger":"loss"|"grad_norm","reproduced":true,"loss":x,"grad_norm":y}
//     (a warning in the event log). Should every rank reproduce its own gradients while the rerun's loss or norm
//     differs from the first pass's (a fault in a gradient summed in place, or in a reduction), the step fails with
//     Sdc naming no rank.
// The comparison needs kernels that repeat bit for bit: the CPU backend's always do, a GPU's only with
// train.deterministic (float atomics otherwise), so on a GPU without it the rerun is off (a note at start says so).
// Cost: without a spike, two detector updates and one agreement (a one-float all-reduce per group) per step; a spike
// costs one more forward, backward and reduction, and two hashes of the local gradients. The detectors start empty
// in each attempt (10 steps of warm-up, as the loss-spike warning's).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megatrain/train/forward_backward.h"
#include "megatrain/train/loss_spike.h"
#include "megatrain/train/model_stack.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"
#include "megatrain/train/update.h"

namespace mt {

class SdcRerun {
 public:
  SdcRerun(const RunConfig& cfg, Topology& topo, ModelStack& stack, ForwardBackward& fb, Update& update);

  // After step `step`'s gradients are reduced (loss: the replicas' mean; norm: the global gradient norm), before its
  // update. Collective over every rank when train.sdc_rerun_on_spike is set. Returns when nothing spiked or the
  // rerun reproduced (the reduced gradients are then the first pass's); throws kind Sdc on every rank otherwise.
  void after_gradients(int step, float loss, double norm);
  int reruns() const { return reruns_; }
  double seconds() const { return seconds_; }  // spent in reruns (hashes included)

 private:
  std::vector<uint64_t> gradient_hashes();  // per tensor; 0 for those left out
  // Steps 2-5 of the protocol, `trigger` naming the detector that spiked.
  void rerun(int step, float loss, double norm, const std::string& trigger);

  const RunConfig& cfg_;
  Topology& topo_;
  ModelStack& stack_;
  ForwardBackward& fb_;
  Update& update_;
  bool on_;
  LossSpikeDetector loss_spikes_, norm_spikes_;
  std::vector<char> compared_;  // per tensor: its gradient is this rank's own (not summed in place)
  std::vector<float> host_;     // a device gradient's host copy
  int reruns_ = 0;
  double seconds_ = 0;
};

}  // namespace mt
