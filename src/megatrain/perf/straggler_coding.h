// When gradient coding pays: the expected step time of a data-parallel job whose replicas compute redundant
// micro-batch gradients so that the step need not wait for slow replicas, against the uncoded step that waits.
//
// The setting. A replica is one whole model copy (tp x pp GPUs); there are n = dp replicas. A task is one
// micro-batch's gradient; the rounds are the m micro-batch rounds of one optimizer step, and round t's job is the
// sum of its n tasks. A replica is slow (a straggler) in a round when one of its nodes runs (1 + d) times slower:
// a replica is as slow as its slowest node, and a synchronous step as slow as its slowest replica.
//
// The straggler process. Each replica, independently, is a two-state Markov chain over rounds: healthy -> slow
// with probability a, slow -> healthy with probability b = 1 / D, so a burst lasts D rounds on average (geometric)
// and the stationary probability that a replica is slow in a round (the "rate") is r = a / (a + b). Persistent
// stragglers are the limit D -> infinity (a = b = 0): a replica is slow in every round or in none, with probability
// r. MegaScale's numbers (§5.1 / §6.3: ~0.5% of nodes ~10% slower, persistently until evicted) are the point
// r = 1 - (1 - f)^k for replicas of k nodes, f = 0.005, d = 0.1, D persistent. MegaScale evicts those nodes, so
// what is left for a coding scheme to catch is transient: bursts of a few rounds, whose rate no paper gives. That
// is why the crossovers below are given as rates and slowdowns rather than as one verdict.
//
// The schemes, each as its computational load (work per replica per round, relative to the uncoded 1 micro-batch)
// and the straggler patterns it tolerates; the delay T is how many rounds after its own a round's job may finish
// (a step's jobs must finish inside the step: T <= m - 1).
//  * none: load 1; the step waits for its slowest replica.
//  * GC(s) (Tandon, Lei, Dimakis, Karampatziakis, "Gradient Coding", ICML 2017): each replica computes s + 1 tasks
//    per round (load s + 1, i.e. (s + 1) / n of the round's total); tolerates any s stragglers in a round; T = 0.
//  * SR-SGC and M-SGC (Krishnan, Ebrahimi, Khisti, "Sequential Gradient Coding For Straggler Mitigation",
//    ICLR 2023, arXiv 2211.13802) tolerate the (B, W, lambda)-bursty pattern: in every window of W consecutive
//    rounds at most lambda distinct replicas straggle, and a replica straggling in a round did not straggle in the
//    window's rounds more than B - 1 before it (its straggling fits one burst of at most B rounds).
//    SR-SGC (selective reattempt: GC(s) plus repeating unfinished tasks B rounds later): B divides W - 1,
//    s = ceil(B lambda / (W - 1 + B)), load s + 1, T = B.
//    M-SGC (multiplexed: GC over a subset of the minitasks, repetition for the rest):
//    load (lambda + 1)(W - 1 + B) / (B + (W - 1)(lambda + 1)) for lambda < n, (W - 1 + B) / (W - 1) for
//    lambda = n; T = W - 2 + B. (The paper's load formulas, which it divides by n; they agree with the authors'
//    released simulation code, github.com/mamaj/Sequential-Gradient-Coding, whose per-round check of the pattern
//    straggler_coding_sim follows.)
//
// The step. Let H(L) be the healthy step time when every replica does L times its uncoded micro-batch work (the
// per-micro-batch part of the step scales by L; the gradient exchange does not: a coded replica sends one
// combination of its gradients, the size of one gradient). Replicas synchronise at the step's end, so the uncoded
// step is the slowest replica's time: with S_i the rounds replica i is slow in,
//   E[none] = H(1) (1 + d E[max_i S_i] / m)
// (persistent stragglers: E[max_i S_i] / m = 1 - (1 - r)^n, "the step waits if any replica is slow"; the
// distribution of S is exact for the chain). A coded step does not wait for a slow replica in a round whose
// straggler pattern the scheme tolerates, and falls back (waits, as uncoded) in a round it does not:
//   E[coded] <= H(L) (1 + d min(P_fallback, E[max_i S_i] / m)),  P_fallback = 1 - P(the round is tolerated),
// because what a replica is still waited for is at most the fallback rounds (m P_fallback on average) and at most
// its own slow rounds (and a rule that forgets the stragglers it waited for, as the authors' simulation does, only
// falls back less). Where this bound beats none a scheme surely pays; straggler_coding_sim simulates the waiting
// itself. For GC(s), P_fallback = P(Binomial(n, r) > s); for the SGC schemes it is the chance that more than
// lambda replicas straggle in the window of W rounds ending at the round or one of them breaks the burst
// condition, exact for independent replicas under the chain (checked per round, as the authors' simulation does:
// a round that breaks the pattern waits for every replica).
// Left out, each in coding's favour: decoding and the coded combination's arithmetic, the extra memory of s + 1
// micro-batches' activations, and the delay T's effect on the step's last rounds.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace mt::perf {

struct StragglerProcess {
  double rate = 0;      // probability that a given replica is slow in a given round (stationary)
  double duration = 0;  // mean rounds a burst lasts (>= 1); 0 = persistent (never ends)
  double slowdown = 0;  // a slow replica's round takes (1 + slowdown) times as long
  bool persistent() const { return duration <= 0; }
  // healthy -> slow and slow -> healthy probabilities per round (0 and 0 when persistent)
  double start() const;
  double end() const { return persistent() ? 0 : 1 / duration; }
  // The largest rate a process with this mean burst can have (a <= 1): duration / (duration + 1); 1 if persistent.
  double max_rate() const;
};
// Refuses a process that cannot be (rate outside [0, max_rate()], duration in (0, 1), negative slowdown) with an
// mt::Error (kind Config) naming the flag (--straggler-rate, --straggler-duration, --straggler-slowdown).
void validate_process(const StragglerProcess& p);

// MegaScale's persistent slow nodes as a per-replica rate: 1 - (1 - node_fraction)^replica_nodes.
double replica_rate(double node_fraction, int replica_nodes);

// P(a replica is never slow in W consecutive rounds) = (1 - r)(1 - a)^(W - 1).
double clean_probability(const StragglerProcess& p, int W);
// P(a replica is slow in the window's last round and also in one of its rounds W-1 .. B before it, i.e. its
// straggling in the window does not fit one burst of at most B rounds) = r (1 - (1 - r)(1 - q^B)(1 - a)^(W-1-B)),
// q = 1 - a - b the chain's second eigenvalue (two-state chains are reversible). 0 when W <= B.
double burst_violation_probability(const StragglerProcess& p, int B, int W);
// P(at most lambda of n independent replicas straggle in the window of W rounds and none breaks the B condition):
// sum_{j <= lambda} C(n, j) u^j c^(n - j), c = clean_probability, u = 1 - c - burst_violation_probability.
// (B, W) = (1, 1) is one round: P(Binomial(n, r) <= lambda), GC's condition.
double tolerated_probability(const StragglerProcess& p, int n, int B, int W, int lambda);
// The distribution of S, a replica's slow rounds among m consecutive ones (element k: P(S = k), k = 0..m).
std::vector<double> slow_rounds_distribution(const StragglerProcess& p, int m);
// E[max_i S_i] over n independent replicas = sum_{k=0}^{m-1} (1 - P(S <= k)^n). Persistent: m (1 - (1 - r)^n).
double expected_max_slow_rounds(const StragglerProcess& p, int n, int m);

enum class CodingScheme { None, GC, SRSGC, MSGC };
std::string scheme_name(CodingScheme s);

struct CodingParams {
  int s = 0;                     // GC, and SR-SGC's derived s
  int B = 1, W = 1, lambda = 0;  // the bursty pattern (GC: 1, 1, s)
};
// Load relative to the uncoded per-replica work (1 for none, s + 1 for GC and SR-SGC, the M-SGC formula).
double coding_load(CodingScheme s, int n, const CodingParams& q);
// Rounds a job may finish after its own (0 none / GC, B for SR-SGC, W - 2 + B for M-SGC).
int coding_delay(CodingScheme s, const CodingParams& q);
// SR-SGC's s = ceil(B lambda / (W - 1 + B)).
int srsgc_s(int B, int W, int lambda);

// The healthy step as a function of the load: H(L) = fixed + per_load x L (H(1) is the uncoded healthy step).
struct HealthyStep {
  double fixed = 0, per_load = 0;
  double at(double load) const { return fixed + per_load * load; }
};

struct SchemeOutcome {
  CodingScheme scheme = CodingScheme::None;
  CodingParams params;
  double load = 1;
  int delay = 0;
  double p_fallback = 0;      // per round (none: P(some replica is slow in the round))
  double max_slow_share = 0;  // E[max_i S_i] / m: the uncoded step's waiting, in rounds of slowdown per round
  double waited_share = 0;    // what this scheme still waits (none: max_slow_share; coded: its upper bound)
  double step_seconds = 0;    // expected: H(L) (1 + d waited_share)
};
// One scheme with given parameters. Parameters a scheme cannot have (s >= n, B not dividing W - 1 for SR-SGC,
// B >= W, lambda > n, delay > m - 1) are refused (mt::Error, kind Config).
SchemeOutcome evaluate_scheme(CodingScheme s, const CodingParams& q, const StragglerProcess& p, int n, int m,
                              const HealthyStep& h);
// SR-SGC or M-SGC with the (B, W, lambda), lambda >= 1, delay <= m - 1, that gives the least expected step time
// (W over every value up to 48 and a geometric ladder beyond; B likewise up to 16). Nothing when m = 1 (no room
// for a delay) or n = 1.
std::optional<SchemeOutcome> best_sgc(CodingScheme s, const StragglerProcess& p, int n, int m, const HealthyStep& h);

// The rates at which a scheme (SGC schemes with their best parameters at each rate) beats none, at the process's
// duration and slowdown: the interval [from, to] of rates in (0, max_rate] where its expected step is shorter,
// found on a logarithmic grid from 1e-6 (80 points) and refined by bisection (relative 1e-4); with the grid point
// where it gains most (gain: none's expected step / the scheme's - 1). Nothing when it never does.
struct RateInterval {
  double from = 0, to = 0;
  double best_rate = 0, best_gain = 0;
};
std::optional<RateInterval> paying_rates(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, int n,
                                         int m, const HealthyStep& h);
// The least slowdown at which the scheme beats none at the process's rate and duration. The gain is linear in d
// for fixed parameters: none - coded = H(1) - H(L) + d (H(1) P_none - H(L) P_coded), so each parameter set pays
// from (H(L) - H(1)) / (H(1) P_none - H(L) P_coded) when the denominator is positive; the least over parameters.
// Nothing when no parameter set ever pays.
std::optional<double> paying_slowdown(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, int n, int m,
                                      const HealthyStep& h);
// The least slowdown at which the scheme pays at any rate (at the process's duration), and that rate: the least
// paying_slowdown over a logarithmic grid of rates from 1e-5 to max_rate (60 points). Nothing when none pays.
struct SlowdownPoint {
  double slowdown = 0, rate = 0;
  CodingParams params;  // the parameters that pay from that slowdown
  double load = 1;
};
std::optional<SlowdownPoint> least_paying_slowdown(CodingScheme s, const CodingParams& gc, const StragglerProcess& p,
                                                   int n, int m, const HealthyStep& h);

}  // namespace mt::perf
