#include "megatrain/train/slow_rounds.h"

#include <algorithm>
#include <cstdio>

namespace mt {

SlowRounds::SlowRounds(int rank, int replica, int workers, int rounds_per_step, int steps)
    : rank_(rank), replica_(replica), per_step_(rounds_per_step) {
  for (const Fault& f : faults_for(FaultKind::SlowBurst, rank)) {
    Item it{f, {}};
    if (f.burst_b > 0)
      it.pattern = bursty_pattern(workers, steps * rounds_per_step, {f.burst_b, f.burst_w, f.burst_lambda}, f.burst_p,
                                  f.burst_seed);
    items_.push_back(std::move(it));
  }
}

double SlowRounds::factor(int step, int round, bool fires) const {
  for (const Item& it : items_) {
    bool slow = false;
    if (it.f.burst_b > 0) {
      const size_t g = static_cast<size_t>((step - 1) * per_step_ + round);
      slow = g < it.pattern.size() && it.pattern[g][static_cast<size_t>(replica_)];
    } else {
      slow = std::find(it.f.rounds.begin(), it.f.rounds.end(), std::pair<int, int>{step, round}) != it.f.rounds.end();
    }
    if (!slow) continue;
    if (!fires) return 1;
    std::fflush(stdout);
    std::fprintf(stderr, "fault injected: %s (rank %d, step %d, round %d, attempt %d)\n", it.f.item.c_str(), rank_,
                 step, round, attempt_from_env());
    std::fflush(stderr);
    return it.f.factor;
  }
  return 1;
}

}  // namespace mt
