// megatrain launch: argument parsing only. The agent that starts and supervises this node's ranks lives in
// src/megatrain/launch/ (agent.h), where the robust-training supervisor grows and tests reach it.
#include <CLI/CLI.hpp>

#include <cstdlib>

#include "megatrain/cli/commands.h"
#include "megatrain/comm/local_address.h"
#include "megatrain/comm/store.h"
#include "megatrain/core/error.h"
#include "megatrain/launch/agent.h"
#include "megatrain/launch/notifier.h"
#include "megatrain/launch/process_util.h"

namespace mt::cli {

namespace {

constexpr const char* kLaunchDescription =
    "Spawn this node's ranks with torchrun-style environment variables (RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus MEGATRAIN_STORE, and supervise them.\n"
    "  megatrain launch --nproc 4 -- train --config configs/tiny.toml\n"
    "  megatrain launch --nproc 8 --nnodes 2 --node-rank 1 --master node01:29500 -- train ...\n"
    "  megatrain launch --nproc 2 --exec -- /bin/sh -c 'echo $RANK'\n"
    "Node 0 serves a tcp:// store on the master address and port (a free port on one node) unless --store\n"
    "is given. Every connection to it must present the job's secret, which the ranks get in\n"
    "MEGATRAIN_STORE_SECRET: a fresh random one on one node; on several nodes set MEGATRAIN_STORE_SECRET\n"
    "to the same value on every node (or give --secret-file). Multi-node ranks communicate on the\n"
    "interface that routes to the master, or on --iface.\n"
    "If a rank fails, or the launcher gets SIGINT/SIGTERM, every rank is stopped (SIGTERM, then SIGKILL\n"
    "after --grace seconds). With --max-restarts N a failure that a restart may help (not a config, data or\n"
    "checkpoint error) restarts every rank, which resume from the newest checkpoint; hangs are detected\n"
    "from the ranks' heartbeats and the blocking rank is named. --events FILE logs every fault,\n"
    "detection and restart as JSON lines; --dashboard HOST:PORT serves a web page of the job, its state\n"
    "as JSON and Prometheus metrics (--dashboard-token-file to require a token; `megatrain status URL`\n"
    "reads it from a terminal); --notify URL posts faults, restarts and the end to a webhook. A rank\n"
    "blamed for a hang has its stacks dumped (gdb) beside the event log before it is killed.\n"
    "On several nodes, --max-restarts makes node 0's agent the job driver: every node's agent\n"
    "(--node-rank 0..nnodes-1, plus --spares more that wait) reports to it through the store; a lost node\n"
    "(--node-timeout), a hang's blamed node and a node failing `megatrain diagnose` are evicted, and the\n"
    "job restarts on a spare, or shrinks to fewer data-parallel replicas when none is left.";

// megatrain launch's options, with the two that are read into LaunchOptions only after parsing.
struct LaunchArgs {
  launch::LaunchOptions o;
  std::string token_file;     // --dashboard-token-file
  std::string notify_events;  // --notify-events, comma-separated
};

// The node's ranks: how many, where, what they run and how they are stopped.
void add_rank_options(CLI::App& app, launch::LaunchOptions& o) {
  app.add_option("--nproc,-n", o.nproc, "ranks to start on this node")->required()->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", o.nnodes, "nodes in the job (default 1)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--node-rank", o.node_rank, "this node's index, 0..nnodes-1 (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
      "--master", o.master,
      "ADDR[:PORT] of node 0 (its store; default 127.0.0.1 and a free port on one node, port 29500 on several)");
  app.add_option("--store", o.store, "use this store URL (file://, tcp://, redis://) instead of serving one");
  app.add_option("--iface", o.iface,
                 "interface (e.g. eth1) or local address the ranks communicate on (sets MEGATRAIN_IFACE; default: "
                 "loopback on one node, the interface that routes to the master on several)");
  app.add_option("--secret-file", o.secret_file,
                 "file whose first line is the store secret (mode 600; default: MEGATRAIN_STORE_SECRET, else a "
                 "random one on one node)");
  app.add_flag("--exec", o.exec, "ARGS[0] is a program to run (default: ARGS are a megatrain subcommand)");
  app.add_option("--grace", o.grace, "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-prefix", o.no_prefix, "copy the ranks' output without the '[rank R] ' prefix");
}

// Supervision: restarts, hang and straggler detection, the event log, the dashboard and notifications.
void add_supervision_options(CLI::App& app, LaunchArgs& a) {
  launch::LaunchOptions& o = a.o;
  auto* sup = "supervision";
  app.add_option("--max-restarts", o.max_restarts, "restarts after failures a restart may help (default 0: none)")
      ->check(CLI::Range(0, 1000000))
      ->group(sup);
  app.add_option("--events", o.events, "append the supervisor's events to this file (JSON lines)")->group(sup);
  app.add_option("--dashboard", o.dashboard,
                 "serve the job's dashboard (/), its state as JSON (/api/job) and Prometheus metrics (/metrics) on "
                 "HOST:PORT (port 0: any free one; the URL is printed and logged as a 'dashboard' event); on several "
                 "nodes node 0 serves it")
      ->group(sup);
  app.add_option("--dashboard-token-file", a.token_file,
                 "the dashboard answers only requests carrying the token in this file (Authorization: Bearer TOKEN, "
                 "or ?token=TOKEN); default: MEGATRAIN_DASHBOARD_TOKEN if set, else no token")
      ->group(sup);
  app.add_option("--dashboard-tls-cert", o.dashboard_tls.cert,
                 "serve the dashboard over HTTPS with this PEM certificate (a chain: the server's first); needs "
                 "--dashboard-tls-key")
      ->group(sup);
  app.add_option("--dashboard-tls-key", o.dashboard_tls.key,
                 "the certificate's PEM private key, unencrypted and readable by its owner only (chmod 600)")
      ->group(sup);
  app.add_option("--notify", o.notify,
                 "POST the job's events (a fault detected, a restart, a resume, an eviction, done, gave up) to this "
                 "http(s) webhook as JSON with a 'text' line; default: MEGATRAIN_NOTIFY_URL if set. Node 0 sends")
      ->group(sup);
  app.add_option("--notify-events", a.notify_events,
                 "which events to send (comma-separated names from the event log, EVENT:REASON for only those lines "
                 "of an event, e.g. warning:loss_spike, or 'all'; default detected,restarting,resumed,evicted,done,"
                 "gave_up)")
      ->group(sup);
  app.add_option("--notify-ca", o.notify_ca,
                 "PEM file of the CAs that sign an https webhook's certificate "
                 "(default: the system's)")
      ->group(sup);
  app.add_option("--job-name", o.job_name,
                 "the job's name in notifications (default: SLURM_JOB_NAME, else the "
                 "host name)")
      ->group(sup);
  app.add_flag("!--no-stack-dumps", o.stack_dumps,
               "do not dump a rank's stacks (gdb) before killing it for a hang (default: dump them, beside --events)")
      ->group(sup);
  app.add_option("--stack-timeout", o.stack_timeout_s, "seconds gdb may take for one rank's stacks (30)")
      ->check(CLI::Range(1.0, 600.0))
      ->group(sup);
  app.add_option("--backoff", o.backoff_s, "seconds before the first restart, doubling while no progress is made (1)")
      ->check(CLI::Range(0.0, 3600.0))
      ->group(sup);
  app.add_option("--no-progress-limit", o.no_progress_limit,
                 "attempts in a row without passing the best step before giving up with exit 40 (3)")
      ->check(CLI::Range(1, 1000))
      ->group(sup);
  app.add_option("--hang-floor", o.hang_floor_s,
                 "a hang is no step for max(--hang-factor x the median step time, this many seconds) (30)")
      ->check(CLI::Range(0.5, 1e6))
      ->group(sup);
  app.add_option("--hang-factor", o.hang_factor, "see --hang-floor (5)")->check(CLI::Range(1.0, 1000.0))->group(sup);
  app.add_option("--startup-timeout", o.startup_timeout_s,
                 "seconds the first step of an attempt may take, start-up and checkpoint loading included (600)")
      ->check(CLI::Range(0.5, 1e6))
      ->group(sup);
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "a live rank that sends no heartbeat for this long is stopped or wedged: a hang (10)")
      ->check(CLI::Range(0.5, 1e6))
      ->group(sup);
  app.add_option(
         "--straggler-factor", o.straggler_factor,
         "warn when a rank's compute time exceeds this x its peers' median ... (1.1: a 20% straggler is flagged)")
      ->check(CLI::Range(1.0, 100.0))
      ->group(sup);
  app.add_option("--straggler-steps", o.straggler_steps, "... for this many steps in a row (3)")
      ->check(CLI::Range(1, 1000000))
      ->group(sup);
}

// Several nodes: spares, lost nodes, diagnosis and eviction.
void add_node_options(CLI::App& app, launch::LaunchOptions& o) {
  auto* nodes = "several nodes (the job driver runs in node 0's agent)";
  app.add_option("--spares", o.spares,
                 "agents beyond --nnodes (started with --node-rank nnodes..) that wait to replace an evicted node (0)")
      ->check(CLI::Range(0, 1 << 20))
      ->group(nodes);
  app.add_option("--node-timeout", o.node_timeout_s, "a node whose agent is silent this long is lost (8)")
      ->check(CLI::Range(1.0, 3600.0))
      ->group(nodes);
  app.add_flag("!--no-diagnose", o.diagnose,
               "do not run `megatrain diagnose` on the nodes of a failed attempt (and on spares) before going on")
      ->group(nodes);
  app.add_option("--diagnose-expect", o.diagnose_expect,
                 "a healthy node's values (diagnose --save) that diagnose judges against (default: correctness only)")
      ->group(nodes);
  app.add_flag("!--no-shrink", o.shrink,
               "with no spare left, give up (exit 42) instead of going on with fewer data-parallel replicas")
      ->group(nodes);
  app.add_option("--straggler-evict-steps", o.straggler_evict_steps,
                 "a rank that stays a straggler this many steps gets its node evicted (0: never; default 0)")
      ->check(CLI::Range(0, 1000000))
      ->group(nodes);
}

// What the options say together, checked before anything starts: the command, the node's place, the store.
void check_launch_layout(launch::LaunchOptions& o) {
  MT_CHECK(!o.args.empty(), "nothing to launch: give the command after '--', e.g. megatrain launch --nproc 2 -- train");
  MT_CHECK(o.node_rank < o.nnodes + o.spares, "--node-rank {} must be below --nnodes {} + --spares {}", o.node_rank,
           o.nnodes, o.spares);
  if (o.nnodes + o.spares > 1 && o.store.empty()) {
    MT_CHECK(!o.master.empty(), "--nnodes {} needs --master ADDR:PORT (node 0's address) or --store URL", o.nnodes);
    if (o.master.rfind(':') == std::string::npos || o.master.back() == ']') o.master += ":29500";
  }
  MT_CHECK(o.spares == 0 || o.max_restarts > 0,
           "--spares {} without --max-restarts: a spare only ever replaces a node in a restart", o.spares);
  MT_CHECK(o.dashboard.empty() || o.driven(),
           "--dashboard on {} nodes needs the job driver (--max-restarts 1 or more): without it no process sees "
           "every rank",
           o.nnodes);
  if (!o.iface.empty()) local_address_of(o.iface, "--iface");  // a typo fails here, not in every rank
}

// The dashboard's token and TLS files.
void resolve_dashboard_access(launch::LaunchOptions& o, const std::string& token_file) {
  // Secrets come from files or the environment, never the command line, which every user of the host can read.
  // (The variable may be set for `megatrain status` too: without --dashboard it is simply not used.)
  if (!token_file.empty()) {
    if (o.dashboard.empty()) fail_as(ErrorKind::Config, "--dashboard-token-file without --dashboard");
    // The store secret's rules (comm/store.h): mode 600, 16..1024 printable bytes.
    o.dashboard_token = with_kind(ErrorKind::Config, [&] { return read_secret_file(token_file, "dashboard token"); });
  } else if (const char* t = std::getenv("MEGATRAIN_DASHBOARD_TOKEN"); t && *t) {
    with_kind(ErrorKind::Config, [&] { check_secret(t, "dashboard token", "MEGATRAIN_DASHBOARD_TOKEN"); });
    o.dashboard_token = t;
  }
  if (!o.dashboard_tls.cert.empty() || !o.dashboard_tls.key.empty()) {
    if (o.dashboard.empty())
      fail_as(ErrorKind::Config, "--dashboard-tls-{} without --dashboard",
              o.dashboard_tls.cert.empty() ? "key" : "cert");
    if (o.dashboard_tls.cert.empty() || o.dashboard_tls.key.empty())
      fail_as(ErrorKind::Config, "--dashboard-tls-{} without --dashboard-tls-{}: HTTPS needs both",
              o.dashboard_tls.cert.empty() ? "key" : "cert", o.dashboard_tls.cert.empty() ? "cert" : "key");
  }
}

// The webhook (--notify, else MEGATRAIN_NOTIFY_URL) and the events sent to it.
void resolve_notify(launch::LaunchOptions& o, const std::string& notify_events) {
  // Notifications are the job driver's (launch/driver.h): without it no process sees the whole job.
  if (!o.notify.empty() && !o.driven())
    fail_as(ErrorKind::Config,
            "--notify on {} nodes needs the job driver (--max-restarts 1 or more): without it no process sees the "
            "whole job",
            o.nnodes);
  if (o.notify.empty())
    if (const char* u = std::getenv("MEGATRAIN_NOTIFY_URL"); u && *u) {
      if (o.driven())
        o.notify = u;
      else
        launch::say(fmt::format("MEGATRAIN_NOTIFY_URL is not used: on {} nodes without --max-restarts there is no job "
                                "driver, which sends the notifications",
                                o.nnodes));
    }
  for (size_t at = 0; !notify_events.empty() && at <= notify_events.size();) {
    const size_t comma = std::min(notify_events.find(',', at), notify_events.size());
    if (comma > at) o.notify_events.push_back(notify_events.substr(at, comma - at));
    at = comma + 1;
  }
  if (o.notify.empty() && (!o.notify_events.empty() || !o.notify_ca.empty()))
    fail_as(ErrorKind::Config, "--notify-events and --notify-ca need --notify URL (or MEGATRAIN_NOTIFY_URL)");
}

}  // namespace

int cmd_launch(int argc, char** argv) {
  CLI::App app{kLaunchDescription, "megatrain launch"};
  LaunchArgs a;
  add_rank_options(app, a.o);
  add_supervision_options(app, a);
  add_node_options(app, a.o);
  app.add_option("args", a.o.args, "after --: the megatrain subcommand and its options (or, with --exec, a program)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  launch::LaunchOptions& o = a.o;
  check_launch_layout(o);
  resolve_dashboard_access(o, a.token_file);
  resolve_notify(o, a.notify_events);
  if (o.job_name.empty()) o.job_name = launch::default_job_name();
  return launch::run_agent(o);
}

}  // namespace mt::cli
