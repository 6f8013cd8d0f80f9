// Straggler patterns and the models a coded data-parallel step tolerates (parallel/straggler_code.h), as data and
// pure checks, so the codes are tested against every pattern a model allows and the fault injector can draw
// patterns from the same definitions.
//
// A pattern is rounds x workers: pattern[r][w] is true when worker (data-parallel replica) w straggled in round r,
// i.e. its result of round r did not arrive in time and the round ended without it.
//
// Models:
//  - per round (Tandon et al. 2017, "Gradient Coding", the setting of their Section 2): at most s stragglers in
//    every round, whoever they are.
//  - (B, W, lambda)-bursty (Krishnan, Ebrahimi, Khisti, "Sequential Gradient Coding For Straggler Mitigation",
//    ICLR 2023, arXiv 2211.13802, the straggler model of its Section 2): in every window of W consecutive rounds,
//    (a) at most lambda distinct workers straggle, and (b) each worker's straggling rounds inside the window lie
//    within one burst of at most B consecutive rounds. Equivalently, a worker that straggles in round r does not
//    straggle in rounds r-W+1 .. r-B (the form the authors' simulator checks round by round). Windows are taken
//    inside the pattern: a pattern shorter than W is one window.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

using StragglerPattern = std::vector<std::vector<bool>>;  // [round][worker]

struct BurstyModel {
  int B = 1;       // longest burst of one worker inside a window (rounds)
  int W = 2;       // window length (rounds), W > B
  int lambda = 1;  // most distinct stragglers inside a window
};

// Config errors naming parallel.straggler_burst / _window / _lambda and the bound broken: 1 <= B < W, 1 <= lambda <= n.
void validate_bursty_model(const BurstyModel& m, int workers);

// Whether every round has at most s stragglers.
bool inside_per_round_model(const StragglerPattern& p, int s);
// Whether the pattern conforms to the (B, W, lambda)-bursty model (every window, as above).
bool inside_bursty_model(const StragglerPattern& p, const BurstyModel& m);
// The first window that breaks the model, as "rounds a..b: <why>", or "" when inside (for messages and logs).
std::string bursty_violation(const StragglerPattern& p, const BurstyModel& m);

// A pattern inside the (B, W, lambda)-bursty model, the same for the same arguments on every machine: round by
// round, each worker not already in a burst starts one with probability start_probability, of a length drawn
// uniformly from 1..B; a start (or a continuation) that would take the pattern outside the model is dropped, so the
// result always conforms. For the fault injector (the `slowburst` fault kind, core/fault_spec.h) and the tests.
StragglerPattern bursty_pattern(int workers, int rounds, const BurstyModel& m, double start_probability, uint64_t seed);

// Text for messages: one line per round, "r3: 0 2" listing the stragglers (rounds without any left out).
std::string to_string(const StragglerPattern& p);

}  // namespace mt
