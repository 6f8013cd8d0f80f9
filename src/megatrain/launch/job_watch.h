// What a supervisor concludes from the ranks' statuses: progress, hangs and stragglers. One node's agent feeds it
// its ranks' heartbeats as they arrive; the job driver feeds it every rank of the job from the statuses the agents
// publish in the store (job_protocol.h). The rules are the same in both places, so they live here once:
//  - Progress is a step completed or any collective moving on (a long evaluation or checkpoint is not a hang while
//    its collectives advance); a hung job has neither.
//  - Hang: no progress for max(hang_factor x the median recent step time, hang_floor_s), or, before the attempt's
//    first step and while a rank initialises, evaluates or checkpoints (work whose length no step time predicts),
//    max(hang_floor_s, startup_timeout_s); or a live rank silent for heartbeat_timeout_s. The line that blames a rank
//    comes from hang_blame.h.
//  - Straggler: a rank whose compute time stays over straggler_factor x its peers' median, and is the job's slowest,
//    for straggler_steps steps in a row is flagged once per attempt; one that stays so for straggler_evict_steps
//    (0: never) is to be evicted. Each step is judged once every rank has reported it, against the peers' compute
//    times at that same step: a heartbeat brings one step, a status (the driver's feed, every half second) each
//    step since the last in its records, and ranks report in any order.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatrain/launch/hang_blame.h"
#include "megatrain/launch/rank_status.h"
#include "megatrain/launch/useful_time.h"

namespace mt::launch {

struct WatchOptions {
  double hang_floor_s = 30;
  double hang_factor = 5;
  double startup_timeout_s = 600;
  double heartbeat_timeout_s = 10;
  double straggler_factor = 1.1;
  int straggler_steps = 3;
  int straggler_evict_steps = 0;
};

// What one status change meant.
struct WatchUpdate {
  bool stepped = false;     // the rank completed a step
  bool first_step = false;  // ... the attempt's first (any rank's)
  bool caught_up = false;   // every rank is now past the best step of the earlier attempts
  // A straggler found by this change: a step every rank has now reported was judged (the rank is not necessarily
  // the one whose change it was).
  int straggler_rank = -1;       // its global rank
  std::string straggler;         // non-empty: it was just flagged (the line says why)
  double straggler_ratio = 0;    // its compute time over its peers' median, at the step judged last
  bool evict_straggler = false;  // it stayed a straggler for straggler_evict_steps steps
};

struct HangFinding {
  std::string why;  // "a rank stopped sending heartbeats" / "no progress (...) for N s (limit M s)"
  Blame blame;
  double since_progress_s = 0;
};

class JobWatch {
 public:
  explicit JobWatch(WatchOptions o) : opt_(o) {}

  // A new attempt of `ranks` ranks (global ranks in order), started at `now`; best_before is the best step the
  // earlier attempts reached (0: none).
  void reset(const std::vector<int>& ranks, double now, int best_before);

  // Rank i's heartbeat line as the rank wrote it (the agent's feed). Lines that are not heartbeats change nothing.
  WatchUpdate apply_heartbeat(size_t i, const nlohmann::json& hb, double now);
  // Rank i's status as another supervisor saw it (the driver's feed); `s.last_heard` is on this clock.
  WatchUpdate apply_status(size_t i, const RankStatus& s, double now);

  // running[i]: rank i's process is alive (a dead rank is no hang). Empty when the attempt is healthy.
  std::optional<HangFinding> check_hang(double now, const std::vector<bool>& running) const;

  const std::vector<RankStatus>& status() const { return status_; }
  int best_step() const { return best_; }  // the highest step any rank reported in this attempt
  int min_step() const;
  // The step the attempt resumed from: the lowest start_step the ranks reported (-1 until one did).
  int start_step() const;
  // Rank 0's steps over every attempt so far (not reset by reset()): the job's effective training time.
  const UsefulTime& useful() const { return useful_; }

 private:
  WatchUpdate after_change(size_t i, int step_before, bool first, double now);
  void note_compute(size_t i, int step, double compute_time);
  void judge_reported_steps(WatchUpdate& u);
  void judge_step(const std::vector<std::optional<double>>& compute, WatchUpdate& u);

  WatchOptions opt_;
  std::vector<RankStatus> status_;
  std::vector<std::string> mark_;  // per rank: step, phase and collective states at its last change
  std::vector<int> straggle_;      // consecutive slow steps per rank
  std::vector<bool> flagged_;      // warned in this attempt
  // Per step not judged yet: each rank's compute time (nullopt: not reported yet). A step some rank never reports
  // (its first status came later) is dropped once a later step is judged.
  std::map<int, std::vector<std::optional<double>>> step_compute_;
  int judged_through_ = 0;
  std::vector<double> recent_step_times_;
  double last_progress_ = 0;
  int best_ = 0, best_before_ = 0;
  UsefulTime useful_;
  int useful_last_ = -1;  // rank 0's newest step record already fed to useful_ in this attempt
  bool resumed_ = false, caught_up_ = false;
};

}  // namespace mt::launch
