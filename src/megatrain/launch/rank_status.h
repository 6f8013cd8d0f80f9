// What the agent knows of one rank, from the heartbeats the rank writes to its MEGATRAIN_HEARTBEAT_FD pipe (one
// JSON object per line; train/heartbeat.h writes them): its step and phase, its coordinates, and the state of the
// newest (or oldest unfinished) collective of each of its process groups, as its flight recorder saw it.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::launch {

// One group's collective as a rank reported it. Every member numbers a group's collectives alike, so equal
// (group, seq) on two ranks is the same collective.
struct CollectiveState {
  std::string group;  // e.g. "dp[1,3]"
  std::string op;     // e.g. "all_gather"
  long seq = -1;
  std::string state;  // "posted" (issued, not yet running), "started" (running: waiting on peers), "done", "failed"
  bool in_flight() const { return state == "posted" || state == "started"; }
};

struct RankStatus {
  int rank = -1;
  std::string coord;             // "dp1,pp0,tp1" ("" until known)
  bool heard = false;            // a heartbeat has arrived
  double last_heard = 0;         // agent clock (now_seconds) of the newest heartbeat
  int step = 0;                  // newest completed step reported
  std::string phase;             // what it was doing then
  std::optional<double> step_time, compute_time;
  std::optional<double> loss, tokens_per_s, mfu;  // of the newest step (the heartbeat's)
  std::optional<double> rss;                      // resident bytes at the newest heartbeat
  int coord_dp = -1, coord_pp = -1, coord_tp = -1;  // coord as numbers (-1 until known)
  std::vector<CollectiveState> colls;
  // The job's layout as the rank reported it (0 until known): a supervisor that shrinks dp keeps the global batch.
  int dp = 0, pp = 0, tp = 0, grad_accum = 0;
  int start_step = -1;           // the step the rank's run started from (-1 until it says)

  // Applies one heartbeat line ({"type":"hb",...}); returns false (and changes nothing) for a line that is not
  // one (events, or garbage: a rank must not be able to crash its agent).
  bool apply(const nlohmann::json& hb, double now);
};

}  // namespace mt::launch
