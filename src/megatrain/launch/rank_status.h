// What the agent knows of one rank, from the heartbeats the rank writes to its MEGATRAIN_HEARTBEAT_FD pipe (one
// JSON object per line; train/heartbeat.h writes them): its step and phase, its coordinates, and the state of the
// newest (or oldest unfinished) collective of each of its process groups, as its flight recorder saw it.
#pragma once
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/obs/moe_load.h"

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

// One completed step, as the rank's step line reported it: what the dashboard's history is made of.
struct StepRecord {
  int step = 0;
  std::optional<double> loss;
  double step_time = 0;
  double heard = 0;                    // agent clock (now_seconds) when the line arrived
  std::optional<double> compute_time;  // the step less its measured waits (the straggler rule's measure)
};

struct RankStatus {
  int rank = -1;
  std::string coord;      // "dp1,pp0,tp1" ("" until known)
  bool heard = false;     // a heartbeat has arrived
  double last_heard = 0;  // agent clock (now_seconds) of the newest heartbeat
  int step = 0;           // newest completed step reported
  std::string phase;      // what it was doing then
  std::optional<double> step_time, compute_time;
  std::optional<double> loss, tokens_per_s, mfu;    // of the newest step (the heartbeat's)
  std::optional<double> rss;                        // resident bytes at the newest heartbeat
  int coord_dp = -1, coord_pp = -1, coord_tp = -1;  // coord as numbers (-1 until known)
  std::vector<CollectiveState> colls;
  // The job's layout as the rank reported it (0 until known): a supervisor that shrinks dp keeps the global batch.
  int dp = 0, pp = 0, tp = 0, grad_accum = 0;
  int start_step = -1;  // the step the rank's run started from (-1 until it says)
  // The step lines of the last kRecentSeconds, at most kMaxRecent, oldest first. The fields above hold only the
  // newest step, and a supervisor that sees them less often than the rank completes steps (the job driver reads
  // each node's statuses every half second; tiny models step in milliseconds) would miss the rest. The window
  // bounds what each status carries: a few records for the seconds-long steps of a large job; the cap still
  // covers half a second of steps down to 2 ms each.
  std::deque<StepRecord> recent;
  obs::MoeLoad moe;  // a MoE model's routing load at the newest step whose "moe" lines all arrived (the main rank's)
  static constexpr double kRecentSeconds = 5;
  static constexpr size_t kMaxRecent = 256;

  // Applies one heartbeat line ({"type":"hb",...}, or a piece of the MoE load, {"type":"moe",...}); returns false
  // (and changes nothing) for a line that is neither (events, or garbage: a rank must not be able to crash its
  // agent). A step line ("at":"step") with a step time joins `recent`.
  bool apply(const nlohmann::json& hb, double now);
  // Drops the records older than kRecentSeconds before now, and the oldest beyond kMaxRecent.
  void trim_recent(double now);
};

}  // namespace mt::launch
