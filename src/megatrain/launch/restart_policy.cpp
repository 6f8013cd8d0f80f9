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

}  // namespace mt::launch
