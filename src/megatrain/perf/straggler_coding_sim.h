// A Monte Carlo check of straggler_coding's bounds on a coded step: simulates the straggler chain of n replicas over
// the m rounds of many steps and applies the scheme's rule round by round, as the authors' simulation of SR-SGC and
// M-SGC does (arXiv 2211.13802, released code): a round whose stragglers keep the pattern within what the scheme
// tolerates does not wait for them, and they are recorded as stragglers; a round that would break it waits for every
// replica, and records none (its results all arrived). GC(s) tolerates a round with at most s stragglers; none
// tolerates nothing. The step waits for the replica with the most slow rounds among the rounds that waited:
// the result is E[max_i S'_i] / m, the waited share the bounds enclose. Each step starts with no recorded history
// (stragglers of the previous step are not held against this one), and each replica's chain starts stationary.
// Deterministic: the same seed gives the same answer (a 64-bit Mersenne Twister, uniform numbers from its top 53
// bits).
#pragma once
#include <cstdint>

#include "megatrain/perf/straggler_coding.h"

namespace mt::perf {

struct SimulatedShare {
  double mean = 0;       // E[max_i S'_i] / m over the steps simulated
  double std_error = 0;  // of the mean
  double fallback = 0;   // share of rounds that waited
};
SimulatedShare simulate_waited_share(CodingScheme s, const CodingParams& q, const StragglerProcess& p, int n, int m,
                                     int steps, std::uint64_t seed = 1);

}  // namespace mt::perf
