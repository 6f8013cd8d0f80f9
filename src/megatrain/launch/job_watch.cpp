#include "megatrain/launch/job_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace mt::launch {

namespace {

// A rank whose extra compute is under this share of the job's median step time is no straggler. Where compute is
// most of a step (any real job) 10% more compute is 10% of the step, and the share never binds. Where it is a small
// part (tiny models, several ranks a core) compute times are milliseconds, and one preemption makes any rank 1.1-5x
// its peers' for a step. Measured on a 2-core host (4 ranks computing 1-3 ms in 50-130 ms steps, 10 steps a run):
// in 8 undisturbed runs, a rank stayed over the factor three steps running once, by at most 3 ms; in 5 runs with a
// rank slowed 3x (MEGATRAIN_FAULTS slow:factor=3), that rank did by 6.5 to 16 ms. 5% of those steps is 2.5-6.5 ms.
constexpr double kStragglerStepShare = 0.05;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

void JobWatch::reset(const std::vector<int>& ranks, double now, int best_before) {
  status_.assign(ranks.size(), RankStatus{});
  for (size_t i = 0; i < ranks.size(); ++i) status_[i].rank = ranks[i];
  mark_.assign(ranks.size(), "");
  straggle_.assign(ranks.size(), 0);
  flagged_.assign(ranks.size(), false);
  step_compute_.clear();
  judged_through_ = 0;
  recent_step_times_.clear();
  last_progress_ = now;
  best_ = 0;
  best_before_ = best_before;
  resumed_ = caught_up_ = false;
  useful_last_ = -1;
}

WatchUpdate JobWatch::apply_heartbeat(size_t i, const nlohmann::json& hb, double now) {
  if (i >= status_.size()) return {};
  RankStatus& s = status_[i];
  const int before = s.step;
  const bool first = !s.heard;  // a rank's first heartbeat (from init) gives the step it starts from: not progress
  if (!s.apply(hb, now)) return {};
  return after_change(i, before, first, now);
}

WatchUpdate JobWatch::apply_status(size_t i, const RankStatus& in, double now) {
  if (i >= status_.size() || !in.heard) return {};
  RankStatus& s = status_[i];
  const int before = s.step;
  const bool first = !s.heard;
  const int rank = s.rank;
  s = in;
  s.rank = rank;
  s.step = std::max(s.step, before);
  // The driver reads statuses every half second, so the first it hears of a rank may already be steps past where
  // the rank started (a short attempt can even be over by then): those steps are progress, not a starting point.
  if (first && s.start_step >= 0 && s.step > s.start_step) return after_change(i, s.start_step, false, now);
  return after_change(i, before, first, now);
}

WatchUpdate JobWatch::after_change(size_t i, int step_before, bool first, double now) {
  WatchUpdate u;
  const RankStatus& s = status_[i];
  std::string mark = fmt::format("{}|{}", s.step, s.phase);
  for (const auto& c : s.colls) mark += fmt::format("|{}#{}{}", c.group, c.seq, c.state);
  if (mark != mark_[i]) {
    if (!first) last_progress_ = now;
    mark_[i] = mark;
  }
  if (s.rank == 0)
    for (const StepRecord& r : s.recent)
      if (r.step > useful_last_) {
        useful_.step(r.step, r.step_time);
        useful_last_ = r.step;
      }
  if (first || s.step == step_before) return u;
  u.stepped = true;
  best_ = std::max(best_, s.step);
  if (s.step_time) {
    recent_step_times_.push_back(*s.step_time);
    if (recent_step_times_.size() > 64) recent_step_times_.erase(recent_step_times_.begin());
  }
  if (!resumed_) resumed_ = u.first_step = true;
  if (!caught_up_ && best_before_ > 0 && min_step() >= best_before_) caught_up_ = u.caught_up = true;
  bool noted = false;  // the compute time of each step since step_before (a status may bring several)
  for (const StepRecord& r : s.recent)
    if (r.step > step_before && r.compute_time) note_compute(i, r.step, *r.compute_time), noted = true;
  if (!noted && s.compute_time) note_compute(i, s.step, *s.compute_time);
  judge_reported_steps(u);
  return u;
}

int JobWatch::start_step() const {
  int m = -1;
  for (const auto& s : status_)
    if (s.start_step >= 0) m = m < 0 ? s.start_step : std::min(m, s.start_step);
  return m;
}

int JobWatch::min_step() const {
  int m = INT_MAX;
  for (const auto& s : status_) m = std::min(m, s.step);
  return m == INT_MAX ? 0 : m;
}

void JobWatch::note_compute(size_t i, int step, double compute_time) {
  if (status_.size() < 2 || step <= judged_through_) return;
  auto& v = step_compute_[step];
  if (v.empty()) v.resize(status_.size());
  v[i] = compute_time;
}

// Judges, in step order, every step all ranks have reported, and drops the unreported steps before the last of them.
void JobWatch::judge_reported_steps(WatchUpdate& u) {
  auto complete = [](const auto& v) {
    return std::all_of(v.begin(), v.end(), [](const auto& c) { return c.has_value(); });
  };
  auto last = step_compute_.begin();  // past the last complete step
  for (auto it = step_compute_.begin(); it != step_compute_.end(); ++it)
    if (complete(it->second)) last = std::next(it);
  for (auto it = step_compute_.begin(); it != last; it = step_compute_.erase(it)) {
    if (!complete(it->second)) continue;
    judge_step(it->second, u);
    judged_through_ = it->first;
  }
}

// A rank whose compute time stays over straggler_factor x its peers' median slows the whole job down (every
// collective waits for it). Only the slowest rank of the job counts: "compute" is step time less the waits the
// collectives measured, and a peer's wait is not all measured (the time before it enters a collective, a core shared
// with the slow rank), so on a loaded host a tp peer of the straggler can also cross the factor. It is never slower
// than the rank it waits for.
void JobWatch::judge_step(const std::vector<std::optional<double>>& compute, WatchUpdate& u) {
  const double floor = kStragglerStepShare * median(recent_step_times_);
  for (size_t i = 0; i < compute.size(); ++i) {
    std::vector<double> peers;
    for (size_t k = 0; k < compute.size(); ++k)
      if (k != i) peers.push_back(*compute[k]);
    const double m = median(peers), mine = *compute[i];
    const bool slowest = mine >= *std::max_element(peers.begin(), peers.end());
    if (m <= 0 || mine <= opt_.straggler_factor * m || !slowest || mine - m < floor) {
      straggle_[i] = 0;
      continue;
    }
    ++straggle_[i];
    const bool flag = !flagged_[i] && straggle_[i] >= opt_.straggler_steps;
    const bool evict = opt_.straggler_evict_steps > 0 && straggle_[i] == opt_.straggler_evict_steps;
    if (!flag && !evict) continue;
    u.straggler_rank = status_[i].rank;
    u.straggler_ratio = mine / m;
    u.evict_straggler = u.evict_straggler || evict;
    if (flag) {
      flagged_[i] = true;
      u.straggler = fmt::format(
          "rank {} ({}) is a straggler: compute {:.3f} s per step against its peers' median {:.3f} s ({:.2f}x) for "
          "{} steps",
          status_[i].rank, status_[i].coord, mine, m, mine / m, opt_.straggler_steps);
    }
  }
}

std::optional<HangFinding> JobWatch::check_hang(double now, const std::vector<bool>& running) const {
  bool any = false, silent = false;
  for (size_t i = 0; i < status_.size(); ++i) {
    if (!status_[i].heard) continue;
    any = true;
    const bool alive = i < running.size() ? running[i] : true;
    if (alive && now - status_[i].last_heard > opt_.heartbeat_timeout_s) silent = true;
  }
  if (!any) return std::nullopt;  // not a megatrain rank (or not yet talking): only exits are supervised
  const bool slow_phase = std::any_of(status_.begin(), status_.end(), [](const RankStatus& r) {
    return r.phase == "init" || r.phase == "eval" || r.phase == "checkpoint";
  });
  const double limit = resumed_ && !slow_phase
                           ? std::max(opt_.hang_floor_s, opt_.hang_factor * median(recent_step_times_))
                           : std::max(opt_.hang_floor_s, opt_.startup_timeout_s);
  if (!silent && now - last_progress_ <= limit) return std::nullopt;
  HangFinding h;
  h.blame = blame_hang(status_, now, opt_.heartbeat_timeout_s);
  h.since_progress_s = now - last_progress_;
  h.why = silent ? "a rank stopped sending heartbeats"
                 : fmt::format("no progress (step or collective) for {:.0f} s (limit {:.0f} s)", h.since_progress_s,
                               limit);
  return h;
}

}  // namespace mt::launch
