// What `megatrain launch` is asked to do on this node. cli/cmd_launch.cpp fills it from the command line and
// checks each field's own range; launch/ checks what depends on several fields (the store, the secret).
#pragma once
#include <string>
#include <vector>

namespace mt::launch {

struct LaunchOptions {
  int nproc = 0;             // ranks on this node
  int nnodes = 1;            // nodes in the job
  int node_rank = 0;         // this node's index
  std::string master;        // ADDR[:PORT] of node 0 (its store)
  std::string store;         // store URL; empty: node 0 serves a tcp store
  std::string iface;         // MEGATRAIN_IFACE for the ranks (an interface name or address); empty: their choice
  std::string secret_file;   // the store secret (else MEGATRAIN_STORE_SECRET, else a fresh one on one node)
  bool exec = false;         // args[0] is a program; otherwise args are a megatrain subcommand
  bool no_prefix = false;    // copy the ranks' output without "[rank R] "
  double grace = 5.0;        // seconds between SIGTERM and SIGKILL when stopping ranks
  std::vector<std::string> args;

  // Supervision (launch/agent.h says what each does).
  int max_restarts = 0;           // restarts after a failure that a restart may help; 0: the first failure ends it
  std::string events;             // the event log (JSON lines); "" = none
  double backoff_s = 1.0;         // first delay before a restart (doubling while attempts make no progress)
  int no_progress_limit = 3;      // attempts in a row without progress before giving up (exit 40)
  double hang_floor_s = 30;       // a hang is declared after max(hang_factor x median step time, this)
  double hang_factor = 5;
  double startup_timeout_s = 600; // no first step within this long (init, rendezvous, loading) is a hang too
  double heartbeat_timeout_s = 10;// a live rank silent this long is stopped or wedged
  double straggler_factor = 1.1;  // compute time over this x the peers' median, straggler_steps in a row: a warning
  int straggler_steps = 3;
};

}  // namespace mt::launch
