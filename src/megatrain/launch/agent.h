// The per-node agent behind `megatrain launch`. It starts this node's ranks with torchrun's environment plus
// MEGATRAIN_STORE, MEGATRAIN_STORE_SECRET (and MEGATRAIN_IFACE), copies their output, and watches them. It does not
// decide restarts: the job driver (driver.h) does, for every job but one (below).
//
// A supervised job (LaunchOptions::driven(): every one-node job, and a multi-node one with --max-restarts or
// --spares) is a driver and its agents, one per node: the driver is a thread of node 0's agent and talks to every
// agent, node 0's included, only through the job store (job_protocol.h). One node is the same job with one agent.
// Per attempt the agent
//  - runs whatever the driver's plan gives its node (or waits as a spare); MEGATRAIN_ATTEMPT counts attempts, and
//    with --max-restarts each gets a fresh store namespace (MEGATRAIN_STORE_PREFIX), so no key of a dead attempt is
//    ever read; a `train` rank resumes from the newest checkpoint (ckpt.resume = auto);
//  - sees a crash at once (a rank that exits non-zero or dies by a signal: SIGCHLD through a signalfd), stops its
//    ranks and stops the attempt (the stop key) for every node;
//  - reads each rank's heartbeats (MEGATRAIN_HEARTBEAT_FD; train/heartbeat.h) and publishes the ranks' statuses
//    every half second, from which the driver judges hangs and stragglers (job_watch.h) and progress;
//  - writes the faults a rank reports itself (a non-finite loss, an injected fault) and alert lines on its stderr
//    ("CUDA error", "out of memory", ...) to the event log;
//  - stops its ranks when the attempt is stopped (SIGTERM, SIGKILL after the grace period; a rank blamed for a hang
//    gets its stacks dumped and SIGKILL at once), and reports how the attempt ended (the end record);
//  - bumps a liveness counter every second; with several agents, runs `megatrain diagnose` when the driver asks
//    after a failed attempt.
// A SIGINT / SIGTERM / SIGHUP to an agent stops its ranks (the signal forwarded) and ends the job (proto::
// kUserStopKey): no restart.
//
// An unsupervised job (several nodes, no --max-restarts, no --spares) has no driver: each agent runs its node's
// ranks once, judges their hangs and stragglers itself with the same rules, and a failure ends its part of the job.
//
// No orphans: every rank leads its own process group (so a stop reaches the rank's own children too) and dies
// with the agent (PR_SET_PDEATHSIG); the agent is a child subreaper, so processes the ranks leave behind become its
// children, and it kills and reaps whatever remains before an attempt ends.
#pragma once
#include "megatrain/launch/options.h"

namespace mt::launch {

// Runs this node's part of the job to completion; returns the exit code: on node 0 of a supervised job the driver's
// (0 when an attempt's ranks all exited 0; else the failure's code when no restart may help (restart_policy.h),
// kNoProgressExit / kRestartsSpentExit / kNoNodesExit when the driver gave up); 128 + the signal that stopped the
// launch; on other nodes the code the driver wrote at the job's end, kEvictedExit, or 22 when the store is gone.
int run_agent(const LaunchOptions& opt);

}  // namespace mt::launch
