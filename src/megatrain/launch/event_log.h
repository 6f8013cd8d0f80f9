// The supervisor's event log: one JSON object per line, appended and flushed as each event happens, so detection
// latency, time to resume and lost steps can be computed from the file alone (bench/ does). Every line has
// "t" (Unix seconds), "event", "attempt" and "node"; the rest depends on the event. Two writers share node 0's log:
// the node's agent (A) and the job driver (D, its lines carry "by": "driver"; driver.h); another node's log has
// only its agent's lines. A job without the driver (several nodes, no --max-restarts) has each agent write all of
// its node's own lines, D's included.
//   started      A  an attempt's ranks were started               ranks, store_prefix, args
//   fault        A  a rank reported or showed a fault             rank, reason (exit code / signal / rank's event)
//   injected     A  a rank did an injected fault                  rank, detail
//   detected     A  a rank exited: the attempt failed             rank, reason "exit", status, code
//                D  ... a hang, a lost node, a straggler to evict reason hang (ranks, nodes, blame), node_lost
//                                                                 (node), straggler (rank, node)
//   stopped      D  every rank of the attempt is gone             seconds (from detection)
//   restarting   D  a new attempt comes after a backoff           delay_s, attempt_best_step, skip_steps, nodes
//   resumed      D  the first step of the new attempt finished    step, from (the step it resumed from)
//   caught_up    D  the new attempt reached the best step before  step
//   warning      A  an alert line on a rank's stderr, or a        rank, reason ("alert", "loss_spike", ...), line
//                   warning the rank reported itself              or detail
//                D  a straggler, a certificate about to expire    rank, reason, ratio, line
//   stacks       A  a rank blamed for a hang, before it is killed rank, pid, frames, file, seconds (error)
//   done / gave_up  D  the end                                    exit_code, reason (and effective training time)
// With more than one agent the driver also writes:
//   registered   an agent joined (a spare with its diagnosis)  node, host, spare, healthy
//   planned      an attempt's nodes and layout                  nodes, world, extra_args, why
//   diagnosed    `megatrain diagnose` of a node after a fault   node, pass, report (also in that node's log)
//   evicted      a node is out of the job                       node, reason
// An agent other than node 0's writes in its own log:
//   fenced       its lease lapsed (node_lease.h): it killed its   lease_age_s, node_timeout_s, ranks_killed
//                ranks and left the job (exit 22)
//   done / gave_up  the job's end as the driver wrote it, or its own leaving (exit 22, the store is gone)
#pragma once
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::launch {

class EventLog {
 public:
  EventLog() = default;
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Appends to path (creating its folder); "" keeps the log off. Throws mt::Error naming the path it cannot open.
  void open(const std::string& path, int node);
  void set_attempt(int attempt) { attempt_ = attempt; }
  // Writes {"t":..., "event": event, "attempt":..., "node":..., fields...}, and hands it to the observers. Any thread
  // may write (the agent's fence thread does); lines never interleave.
  void write(const std::string& event, nlohmann::json fields = nlohmann::json::object());
  // Called with every event written from then on (the dashboard's feed, the webhook's), on the writer's thread.
  // Add observers before the log is shared between threads.
  void add_observer(std::function<void(const nlohmann::json&)> f) { observers_.push_back(std::move(f)); }

 private:
  std::mutex mu_;
  std::FILE* f_ = nullptr;
  std::vector<std::function<void(const nlohmann::json&)>> observers_;
  int node_ = 0, attempt_ = 0;
};

}  // namespace mt::launch
