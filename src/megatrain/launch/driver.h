// The job driver: the one supervisor of a job (`megatrain launch` on one node, or on several with --max-restarts or
// --spares). It runs inside node 0's agent, on a thread of its own, and talks to every agent (node 0's included)
// only through the job store (job_protocol.h); a one-node job is a driver with one agent. It alone decides
// restarts, publishes the dashboard's view and feeds the webhook. Per attempt it
//  - plans: which agents run which node slot. The first attempt takes agents 0..N-1; after a failure, a slot whose
//    agent is out (lost, evicted) goes to the lowest healthy spare; with no spare left the job shrinks to fewer
//    data-parallel replicas (`--parallel.dp` of the command lowered so that world = nodes x nproc still holds
//    tp x pp x dp), which the resharding checkpoint loader resumes, and a line says what the new layout is;
//  - watches: every agent's liveness counter (a node whose counter stands still for --node-timeout is lost), and
//    every rank's status as its agent publishes it, with the hang and straggler rules of job_watch.h, so a hang is
//    blamed on a rank of whichever node it is;
//  - stops the attempt (the stop key) on a hang, a lost node or a straggler to evict; an agent stops it itself when
//    one of its ranks fails;
//  - after the attempt, reads every agent's end record with its `megatrain diagnose` result, evicts the nodes that
//    failed diagnosis, were lost, or held the blamed rank of a hang or an evicted straggler, and restarts by
//    restart_policy.h; a signalled agent ends the job (also during a backoff: proto::kUserStopKey).
// Spares register like any agent and check themselves with diagnose before they may be enlisted.
// With one agent there is nothing to choose, lose or replace: no "planned" or "registered" events, no diagnosis and
// no eviction (a hang's node is restarted where it is), and node 0's agent, in the driver's own process, is never
// declared lost.
// The driver is a single point of failure, as MegaScale's is: if node 0 (its host, or its agent process) dies, the
// store and the driver go with it, every other agent exits 22 (peer lost), and the scheduler must requeue the job.
#pragma once
#include "megatrain/comm/store.h"
#include "megatrain/launch/event_log.h"
#include "megatrain/launch/options.h"

namespace mt::launch {

class Dashboard;  // dashboard.h
class Notifier;   // notifier.h

// Runs the job from the driver's side; returns the job's exit code, which it also writes to job/done for every
// agent. `store` is the driver's own client of the job store; `events` its event log (node 0's). With a
// dashboard, the driver publishes its view of every rank to it and its events go there too; with a notifier, its
// events go to the webhook.
int run_driver(const LaunchOptions& opt, Store& store, EventLog& events, Dashboard* dashboard = nullptr,
               Notifier* notifier = nullptr);

}  // namespace mt::launch
