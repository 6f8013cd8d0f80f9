// Fault specs: what MEGATRAIN_FAULTS asks for, parsed (the injector that fires them is train/faults.h). Below every
// library that injects one: obs/ reads its clock skew here, train/ the rest. MEGATRAIN_FAULTS is a ';'-separated
// list of `kind:key=value:...` items.
//   crash:rank=R:step=S       rank R kills itself with SIGKILL at the start of step S (as a real crash: no
//                              cleanup, no exit code, no checkpoint)
//   hang:rank=R:step=S        rank R blocks forever inside the first collective or transfer it enters at or after
//                              the start of step S: held before the op reaches the backend (its flight-recorder
//                              entry stays "posted"), while its heartbeat thread goes on, as with a stuck NCCL kernel
//   nan:rank=R:step=S         at the start of step S one weight of rank R's model becomes NaN, so its loss and
//                              gradients, and through the collectives every rank's gradient norm, turn NaN as in a
//                              real divergence: the run fails before the optimizer step (exit code 20)
//   slow:rank=R:factor=F[:step=S]   from step S (default 1) on, rank R sleeps (F-1) x its previous step's compute
//                              time at the start of each step: its compute time is stretched F times
//   badnode:node=N            read only by `megatrain diagnose` (fault_badnode): node N's checks fail
//   stage2_delay:seconds=T[:rank=R]   every stage 2 of a checkpoint save (train/ckpt_async.h) on rank R (default:
//                              every rank) sleeps T seconds before writing, so a kill can land inside it
//   kill_after_snapshot:rank=R:step=S   rank R kills itself with SIGKILL right after stage 1 of its checkpoint
//                              save of step S, its background work just posted: a rank lost with its snapshot only
//                              in memory
//   clock_skew:rank=R:seconds=T   the trace clock (obs/timeline.h) of the process whose RANK is R (unset: 0) runs T
//                              seconds (any sign) ahead: hosts whose clocks disagree
//   bitflip:rank=R:step=S     right after step S's optimizer update, rank R flips one mantissa bit of one weight
//                              (the first element of a block's first parameter), for good: a silent data
//                              corruption its data-parallel replicas do not share (found by train.sdc_check_every)
//   sdcgrad:rank=R:step=S     in step S, rank R multiplies one element of its own gradient (the first element of a
//                              block's first parameter whose gradient no tp sum touches) by 2^20 after the backward
//                              has finished it and before its data-parallel reduction, once: a transient fault the
//                              reduction spreads to every replica (found by train.sdc_rerun_on_spike; train/sdc_rerun.h)
//   slowburst:rank=R:factor=F:rounds=S.R,S.R,...   straggler coding's slow replica (parallel.straggler_coding): in
//                              round R of step S (rounds count from 0 within a step) each micro-batch of rank R
//                              takes F x its median compute time (the extra slept at the first layer boundary of
//                              its forward), a sleep it cuts short when the job goes on without it
//   slowburst:rank=R:factor=F:b=B:w=W:lambda=L[:p=P][:seed=N]   the same in the rounds the (B, W, L)-bursty
//                              generator draws (parallel/straggler_model.h: bursty_pattern over the data-parallel
//                              replicas and the run's rounds, a burst starting with probability P, default 0.2,
//                              seed N, default 1), rank R's column: several such items with the same b, w, lambda,
//                              p and seed on different ranks stay jointly inside the model
// Every kind also takes attempt=A. A fault fires only in attempt 0 (MEGATRAIN_ATTEMPT, set by the agent on each
// restart; default 0), or with attempt=A only in attempt A. A rank's node is MEGATRAIN_NODE_RANK (default 0).
// A malformed list is a Config error naming the item and what is allowed.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt {

enum class FaultKind {
  Crash,
  Hang,
  Nan,
  Slow,
  BadNode,
  Stage2Delay,
  KillAfterSnapshot,
  ClockSkew,
  BitFlip,
  SdcGrad,
  SlowBurst
};
const char* fault_kind_name(FaultKind k);

struct Fault {
  FaultKind kind = FaultKind::Crash;
  std::string item;  // as written, for messages
  int rank =
      -1;  // crash, hang, nan, slow, kill_after_snapshot, clock_skew, bitflip, sdcgrad; stage2_delay: -1 = every rank
  int node = -1;  // badnode
  int step =
      0;  // crash, hang, nan, kill_after_snapshot, bitflip, sdcgrad: required (>= 1); slow: from this step on (default 1)
  double factor = 1;   // slow
  double seconds = 0;  // stage2_delay (>= 0), clock_skew (any sign)
  int attempt = -1;    // -1: fires in attempt 0 only
  // slowburst: the listed (step, round) pairs, or a bursty model (burst_b > 0) to draw them from
  std::vector<std::pair<int, int>> rounds;
  int burst_b = 0, burst_w = 0, burst_lambda = 0;
  double burst_p = 0.2;
  uint64_t burst_seed = 1;
  bool fires_in(int a) const { return attempt < 0 ? a == 0 : a == attempt; }
};

// Parses a MEGATRAIN_FAULTS value (`source` names it in messages). Empty items (";;", a trailing ';') are skipped.
std::vector<Fault> parse_faults(const std::string& text, const std::string& source = "MEGATRAIN_FAULTS");
std::vector<Fault> faults_from_env();  // MEGATRAIN_FAULTS, or none
int attempt_from_env();                // MEGATRAIN_ATTEMPT, default 0 (Config error when malformed)
int node_from_env();                   // MEGATRAIN_NODE_RANK, default 0

// The faults of `kind` in MEGATRAIN_FAULTS that fire on `rank` in this attempt (MEGATRAIN_ATTEMPT): those naming
// the rank, and those naming none (rank -1).
std::vector<Fault> faults_for(FaultKind kind, int rank);

}  // namespace mt
