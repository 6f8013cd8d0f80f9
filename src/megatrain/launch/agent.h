// The per-node agent behind `megatrain launch`. It starts this node's ranks with torchrun's environment plus
// MEGATRAIN_STORE, MEGATRAIN_STORE_SECRET (and MEGATRAIN_IFACE), copies their output, and supervises them.
//
// Supervision, per attempt (one start of every rank):
//  - Crash: a rank that exits non-zero or dies by a signal is seen at once (SIGCHLD through a signalfd).
//  - Hang: each rank writes heartbeats to a pipe (MEGATRAIN_HEARTBEAT_FD; train/heartbeat.h). No progress (no step
//    completed and no collective moving on) for max(hang_factor x the median step time, hang_floor_s) (before the
//    first step, or while a rank initialises, evaluates or checkpoints: startup_timeout_s), or a live rank silent
//    for heartbeat_timeout_s, is a hang; the line blaming a rank comes from hang_blame.h.
//  - Faults a rank reports itself (a non-finite loss, an injected fault) and alert lines on its stderr ("CUDA
//    error", "out of memory", ...) go to the event log; a straggler (compute time over straggler_factor x its
//    peers' median for straggler_steps steps) is a warning.
// A failed attempt is stopped (SIGTERM to every rank, SIGKILL after the grace period) and, by restart_policy.h,
// restarted: MEGATRAIN_ATTEMPT counts attempts, and each gets a fresh store namespace (MEGATRAIN_STORE_PREFIX), so
// no key of a dead attempt is ever read. A `train` rank resumes from the newest checkpoint (ckpt.resume = auto). A
// non-finite loss at the same step twice in a row adds that step to train.skip_steps for the next attempts.
// A SIGINT / SIGTERM / SIGHUP to the agent stops every rank (the signal forwarded) and ends the job: no restart.
//
// No orphans: every rank leads its own process group (so a stop reaches the rank's own children too) and dies
// with the agent (PR_SET_PDEATHSIG); the agent is a child subreaper, so processes the ranks leave behind become its
// children, and it kills and reaps whatever remains before an attempt ends.
//
// Several nodes (LaunchOptions::driven(): --nnodes > 1 with --max-restarts, or --spares): the agents run whatever
// attempt the job driver (driver.h, a thread of node 0's agent) plans, through the job store (job_protocol.h). An
// agent then leaves hang and straggler judgement to the driver, which sees every node's ranks; it publishes its
// ranks' statuses, bumps a liveness counter every second, stops its ranks when the attempt is stopped (and stops the
// attempt itself when one of its ranks fails), and after a failed attempt runs `megatrain diagnose` on its node.
#pragma once
#include "megatrain/launch/options.h"

namespace mt::launch {

// Runs the job to completion; returns its exit code: 0 when an attempt's ranks all exited 0; else the failure's
// code when no restart may help (restart_policy.h), kNoProgressExit / kRestartsSpentExit when restarts gave up,
// or 128 + the signal that stopped the launch.
int run_agent(const LaunchOptions& opt);

}  // namespace mt::launch
