// What `megatrain launch` is asked to do on this node. cli/cmd_launch.cpp fills it from the command line and
// checks each field's own range; launch/ checks what depends on several fields (the store, the secret).
#pragma once
#include <string>
#include <vector>

#include "megatrain/launch/tls_files.h"

namespace mt::launch {

struct WatchOptions;   // job_watch.h
struct RestartPolicy;  // restart_policy.h

struct LaunchOptions {
  int nproc = 0;            // ranks on this node
  int nnodes = 1;           // nodes in the job
  int node_rank = 0;        // this node's index
  std::string master;       // ADDR[:PORT] of node 0 (its store)
  std::string store;        // store URL; empty: node 0 serves a tcp store
  std::string iface;        // MEGATRAIN_IFACE for the ranks (an interface name or address); empty: their choice
  std::string secret_file;  // the store secret (else MEGATRAIN_STORE_SECRET, else a fresh one on one node)
  bool exec = false;        // args[0] is a program; otherwise args are a megatrain subcommand
  bool no_prefix = false;   // copy the ranks' output without "[rank R] "
  double grace = 5.0;       // seconds between SIGTERM and SIGKILL when stopping ranks
  std::vector<std::string> args;

  // Supervision (launch/agent.h says what each does).
  int max_restarts = 0;         // restarts after a failure that a restart may help; 0: the first failure ends it
  std::string events;           // the event log (JSON lines); "" = none
  std::string dashboard;        // HOST:PORT the dashboard serves on (launch/dashboard.h); "" = none
  std::string dashboard_token;  // a request must carry it (Authorization: Bearer, or ?token=); "" = open
  TlsFiles dashboard_tls;       // certificate and key: the dashboard serves HTTPS; none = plain HTTP
  std::string notify;           // the webhook URL events are POSTed to (launch/notifier.h); "" = none
  std::vector<std::string> notify_events;  // which events; empty: kDefaultNotifyEvents
  std::string notify_ca;                   // CA bundle (PEM) for an https webhook; "": the system's
  std::string job_name;                    // the job's name in notifications
  double backoff_s = 1.0;                  // first delay before a restart (doubling while attempts make no progress)
  int no_progress_limit = 3;               // attempts in a row without progress before giving up (exit 40)
  double hang_floor_s = 30;                // a hang is declared after max(hang_factor x median step time, this)
  double hang_factor = 5;
  double startup_timeout_s = 600;   // no first step within this long (init, rendezvous, loading) is a hang too
  double heartbeat_timeout_s = 10;  // a live rank silent this long is stopped or wedged
  double straggler_factor = 1.1;    // compute time over this x the peers' median, straggler_steps in a row: a warning
  int straggler_steps = 3;
  int straggler_evict_steps = 0;  // a straggler this many steps in a row: evict its node (driver only; 0: never)
  bool stack_dumps = true;        // a rank blamed for a hang gets its stacks dumped (gdb) before it is killed
  double stack_timeout_s = 30;    // ... for at most this long

  // Several nodes (the job driver, launch/driver.h, supervises every job but an unsupervised multi-node one).
  int spares = 0;               // agents beyond nnodes (--node-rank nnodes..nnodes+spares-1) that wait to replace one
  double node_timeout_s = 8;    // an agent whose liveness counter stands still this long is a lost node
  bool diagnose = true;         // agents of a failed attempt run `megatrain diagnose`; failing nodes are evicted
  std::string diagnose_expect;  // a healthy node's values (diagnose --save) to judge against; "": correctness only
  bool shrink = true;           // with no spare left, go on with fewer data-parallel replicas
  // The job driver supervises the job: always on one node, and on several with --max-restarts or --spares. Without
  // them a multi-node job's agents each run their node's ranks once, on their own (as torchrun without restarts).
  bool driven() const { return nnodes == 1 || max_restarts > 0 || spares > 0; }
  // More than one agent: nodes can be lost, evicted, replaced and diagnosed in pairs; plans are worth an event.
  bool several_agents() const { return nnodes + spares > 1; }
  // The ranks run `megatrain train` (not --exec, not another subcommand): they have steps, losses and checkpoints.
  bool trains() const { return !exec && !args.empty() && args[0] == "train"; }
};

// The pieces of the options the supervisors hand to their parts (options.cpp).
WatchOptions watch_options(const LaunchOptions& o);
RestartPolicy restart_policy(const LaunchOptions& o);

}  // namespace mt::launch
