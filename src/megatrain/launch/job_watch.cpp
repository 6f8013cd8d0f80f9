#include "megatrain/launch/job_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace mt::launch {

namespace {

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
  check_straggler(i, u);
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

// A rank whose compute time stays over straggler_factor x its peers' median slows the whole job down (every
// collective waits for it). Only the slowest rank of the job counts: "compute" is step time less the waits the
// collectives measured, and a peer's wait is not all measured (the time before it enters a collective, a core shared
// with the slow rank), so on a loaded host a tp peer of the straggler can also cross the factor. It is never slower
// than the rank it waits for.
void JobWatch::check_straggler(size_t i, WatchUpdate& u) {
  if (status_.size() < 2 || !status_[i].compute_time) return;
  std::vector<double> peers;
  for (size_t k = 0; k < status_.size(); ++k)
    if (k != i && status_[k].compute_time) peers.push_back(*status_[k].compute_time);
  if (peers.empty()) return;
  const double m = median(peers), mine = *status_[i].compute_time;
  const bool slowest = mine >= *std::max_element(peers.begin(), peers.end());
  if (m <= 0 || mine <= opt_.straggler_factor * m || !slowest) {
    straggle_[i] = 0;
    return;
  }
  ++straggle_[i];
  u.straggler_ratio = mine / m;
  if (!flagged_[i] && straggle_[i] >= opt_.straggler_steps) {
    flagged_[i] = true;
    u.straggler = fmt::format(
        "rank {} ({}) is a straggler: compute {:.3f} s per step against its peers' median {:.3f} s ({:.2f}x) for "
        "{} steps",
        status_[i].rank, status_[i].coord, mine, m, mine / m, opt_.straggler_steps);
  }
  if (opt_.straggler_evict_steps > 0 && straggle_[i] == opt_.straggler_evict_steps) u.evict_straggler = true;
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
