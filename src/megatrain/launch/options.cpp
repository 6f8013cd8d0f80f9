#include "megatrain/launch/options.h"

#include "megatrain/launch/job_watch.h"
#include "megatrain/launch/restart_policy.h"

namespace mt::launch {

WatchOptions watch_options(const LaunchOptions& o) {
  WatchOptions w;
  w.hang_floor_s = o.hang_floor_s;
  w.hang_factor = o.hang_factor;
  w.startup_timeout_s = o.startup_timeout_s;
  w.heartbeat_timeout_s = o.heartbeat_timeout_s;
  w.straggler_factor = o.straggler_factor;
  w.straggler_steps = o.straggler_steps;
  w.straggler_evict_steps = o.straggler_evict_steps;
  return w;
}

RestartPolicy restart_policy(const LaunchOptions& o) {
  RestartPolicy p;
  p.max_restarts = o.max_restarts;
  p.backoff_s = o.backoff_s;
  p.no_progress_limit = o.no_progress_limit;
  return p;
}

}  // namespace mt::launch
