// What the job driver and the node agents of a multi-node supervised job say to each other, through the job's
// store (the tcp store node 0 serves, or --store). Everything lives under "job/"; the ranks' own keys live under
// "attempt-N/" (MEGATRAIN_STORE_PREFIX), so the two never meet.
//
//   job/agent/A            an agent's hello (AgentHello): agent A is up, with its host, ranks and spare check
//   job/agent/A/alive      a counter agent A bumps every second (store add): the driver's node-loss detector
//   job/agent/A/evicted    the driver's word that agent A is out (the reason); the agent leaves
//   job/attempt/N/plan     the driver's plan of attempt N (AttemptPlan): which agents run which node slot
//   job/attempt/N/status/A agent A's view of its ranks (their RankStatus), refreshed every half second
//   job/attempt/N/stop     set by whoever first sees attempt N fail (an agent: a rank died; the driver: a hang, a
//                          lost node): {"by", "code", "reason", "kill_now": [global ranks]}; every agent of the
//                          attempt then stops its ranks, killing those in kill_now (blamed for a hang) at once
//   job/attempt/N/end/A    how attempt N ended on agent A (AgentEnd)
//   job/attempt/N/diagnose after a failed attempt, the driver's request that the surviving nodes check themselves:
//                          {"pairs": {"A": {"group": G, "rank": 0|1}, ...}} pairs nodes for the pairwise check
//   job/attempt/N/diag/A   agent A's `megatrain diagnose --json` report
//   job/done               the job's exit code: every agent leaves with it
//
// Agents are named by their --node-rank A (0 .. nnodes + spares - 1), which stays theirs for the whole job; the
// node slot an agent runs (its ranks' RANK = slot x nproc + local rank) comes from each attempt's plan.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/launch/rank_status.h"

namespace mt::launch::proto {

std::string agent_key(int agent);
std::string alive_key(int agent);
std::string evicted_key(int agent);
std::string plan_key(int attempt);
std::string status_key(int attempt, int agent);
std::string stop_key(int attempt);
std::string end_key(int attempt, int agent);
std::string diagnose_key(int attempt);
std::string diag_key(int attempt, int agent);
inline const std::string kDoneKey = "job/done";
// An agent was signalled (SIGINT, SIGTERM, SIGHUP): the job ends with this code, also between attempts.
inline const std::string kUserStopKey = "job/user_stop";
std::string done_ack_key(int agent);  // an agent has read kDoneKey (the driver keeps the store up until then)

struct AgentHello {
  int agent = 0;
  std::string host;
  int nproc = 0;
  nlohmann::json diagnosis;  // a spare's check before it may be enlisted ({} when not run)
  nlohmann::json to_json() const;
  static AgentHello from_json(const nlohmann::json& j);
};

struct AttemptPlan {
  int attempt = 0;
  std::vector<int> nodes;               // agent ids, in node-slot order
  int nproc = 0;                        // ranks per node
  std::vector<std::string> extra_args;  // appended to the command (train overrides: the layout, skipped batches)
  std::string why;                      // one line: what changed from the previous attempt
  int world() const { return int(nodes.size()) * nproc; }
  int slot_of(int agent) const;  // -1 when the agent is not in this attempt
  nlohmann::json to_json() const;
  static AttemptPlan from_json(const nlohmann::json& j);
};

struct AgentEnd {
  int code = 0;            // 0: every rank of this agent exited 0
  bool user_stop = false;  // the agent was signalled: the job ends, no restart
  int best_step = 0;
  int nonfinite_step = -1;
  std::string detected;        // what this agent saw first, if it saw the failure ("rank 3 exited with code 22")
  std::vector<int> sdc_ranks;  // global ranks named as the culprit of a silent data corruption (sdc_strikes.h)
  nlohmann::json to_json() const;
  static AgentEnd from_json(const nlohmann::json& j);
};

// A rank's status as published by its agent. `age` is seconds since its last heartbeat on the agent's clock, so no
// two hosts' clocks are ever compared; so are the ages of the step records in "recent" ([step, loss|null,
// step_time, age] each, those of the last RankStatus::kRecentSeconds), and a MoE model's routing load ("moe",
// obs/moe_load.h's wire form) where the rank sent one.
nlohmann::json status_to_json(const RankStatus& s, bool running, double now);
// Inverse; `last_heard` is put on the reader's clock (now - age). Throws nlohmann::json::exception on a malformed
// record (the caller skips it).
RankStatus status_from_json(const nlohmann::json& j, double now, bool* running);

}  // namespace mt::launch::proto
