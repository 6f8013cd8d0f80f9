#include "megatrain/launch/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace mt::launch {

bool restart_may_help(int code) { return !(code == 2 || (code >= 10 && code < 20)); }

RestartDecision decide_restart(const RestartPolicy& p, int code, int restarts_done, int no_progress_run) {
  RestartDecision d;
  if (!restart_may_help(code)) {
    d.exit_code = code;
    d.reason = fmt::format("exit code {} means restarting cannot help (a config, data, checkpoint or usage error)",
                           code);
    return d;
  }
  if (restarts_done >= p.max_restarts) {
    d.exit_code = p.max_restarts == 0 ? code : kRestartsSpentExit;
    d.reason = p.max_restarts == 0 ? "restarts are off (--max-restarts 0)"
                                   : fmt::format("all {} restarts (--max-restarts) are spent", p.max_restarts);
    return d;
  }
  if (no_progress_run >= p.no_progress_limit) {
    d.exit_code = kNoProgressExit;
    d.reason = fmt::format("{} attempts in a row ended without passing the best step reached before them",
                           no_progress_run);
    return d;
  }
  d.restart = true;
  d.delay_s = std::min(p.backoff_max_s, p.backoff_s * std::pow(2.0, std::max(0, no_progress_run - 1)));
  d.reason = fmt::format("restart {} of {}", restarts_done + 1, p.max_restarts);
  return d;
}

RestartDecision RestartTracker::after_attempt(int code, int attempt_best, int nonfinite_step, std::string* note) {
  const int best_before = best_;
  best_ = std::max(best_, attempt_best);
  if (code == 0) return RestartDecision{};
  no_progress_run_ = attempt_best > best_before ? 0 : no_progress_run_ + 1;
  RestartDecision d = decide_restart(p_, code, restarts_, no_progress_run_);
  if (!d.restart) return d;
  if (nonfinite_step > 0 && nonfinite_step == last_nonfinite_ && skip_.insert(nonfinite_step).second && note)
    *note = fmt::format("step {} was non-finite twice in a row; the next attempts skip its batch", nonfinite_step);
  last_nonfinite_ = nonfinite_step;
  ++restarts_;
  return d;
}

}  // namespace mt::launch
