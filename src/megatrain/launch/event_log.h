// The supervisor's event log: one JSON object per line, appended and flushed as each event happens, so detection
// latency, time to resume and lost steps can be computed from the file alone (bench/ does). Every line has
// "t" (Unix seconds), "event", "attempt" and "node"; the rest depends on the event:
//   started      an attempt's ranks were started               ranks, store_prefix, args
//   fault        a rank reported or showed a fault             rank, reason (exit code / signal / rank's event)
//   detected     the supervisor decided the attempt failed    rank(s), reason, blame (hangs), latency inputs
//   stopped      every rank of the attempt is gone            seconds (from detection)
//   restarting   a new attempt comes after a backoff           delay_s, attempt_best_step, skip_steps
//   resumed      the first step of the new attempt finished    step, from (the step it resumed from)
//   caught_up    the new attempt reached the best step before  step
//   warning      a loss spike, a straggler, an alert line      rank, reason
//   stacks       a rank blamed for a hang, before it is killed  rank, pid, frames, file, seconds (error)
//   done / gave_up  the end                                     exit_code, reason
// Under the job driver (driver.h; its lines carry "by": "driver" and sit in node 0's log) also:
//   registered   an agent joined (a spare with its diagnosis)  node, host, spare, healthy
//   planned      an attempt's nodes and layout                  nodes, world, extra_args, why
//   diagnosed    `megatrain diagnose` of a node after a fault   node, pass, report
//   evicted      a node is out of the job                       node, reason
// and "detected" with reason node_lost (node), hang (ranks, nodes, blame) or straggler (rank, node).
// An agent other than node 0's writes in its own log:
//   fenced       its lease lapsed (node_lease.h): it killed its   lease_age_s, node_timeout_s, ranks_killed
//                ranks and left the job (exit 22)
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
