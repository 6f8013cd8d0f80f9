#include "megatrain/launch/useful_time.h"

#include <fmt/format.h>

namespace mt::launch {

void UsefulTime::step(int step, double seconds) {
  steps_.erase(steps_.lower_bound(step), steps_.end());  // this step again, and what came after it, was lost
  steps_[step] = seconds;
  dirty_ = true;
}

double UsefulTime::seconds() const {
  // Summed afresh rather than kept as a running total: adding and removing the lost steps' times would leave
  // rounding that summing the kept ones does not.
  if (dirty_) {
    sum_ = 0;
    for (const auto& [s, t] : steps_) sum_ += t;
    dirty_ = false;
  }
  return sum_;
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

}  // namespace mt::launch
