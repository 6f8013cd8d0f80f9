#include "megatrain/launch/useful_time.h"

#include <fmt/format.h>

#include "megatrain/launch/event_log.h"
#include "megatrain/launch/process_util.h"

namespace mt::launch {

void UsefulTime::step(int step, double seconds) {
  if (steps_.empty() || step > steps_.rbegin()->first) {
    // The usual case, every step of a running attempt: adding it last is what summing in step order does next.
    steps_.emplace_hint(steps_.end(), step, seconds);
    sum_ += seconds;
    return;
  }
  // A restart runs this step again: it and what came after it were lost. Summed afresh, not by subtracting the
  // lost times, which would leave rounding that summing the kept ones does not.
  steps_.erase(steps_.lower_bound(step), steps_.end());
  steps_[step] = seconds;
  sum_ = 0;
  for (const auto& [s, t] : steps_) sum_ += t;
}

nlohmann::json effective_training_json(const UsefulTime& u, double wall_s) {
  return {{"useful_s", u.seconds()},
          {"wall_s", wall_s},
          {"effective_training", wall_s > 0 ? nlohmann::json(u.seconds() / wall_s) : nlohmann::json()}};
}

std::string effective_training_line(const UsefulTime& u, double wall_s) {
  if (wall_s <= 0 || u.steps() == 0) return "effective training time: no step was kept";
  return fmt::format("effective training time {:.1f}%: the {} steps kept took {:.1f} s of the job's {:.1f} s",
                     100.0 * u.seconds() / wall_s, u.steps(), u.seconds(), wall_s);
}

void write_job_end(EventLog& log, const std::string& event, nlohmann::json fields, const UsefulTime* useful,
                   double wall_s, const std::string& prefix) {
  if (useful) {
    fields.update(effective_training_json(*useful, wall_s));
    say(prefix + effective_training_line(*useful, wall_s));
  }
  log.write(event, std::move(fields));
}

}  // namespace mt::launch
