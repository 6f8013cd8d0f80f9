// When gradient coding pays (perf/straggler_coding, perf/coding_at_scale) against independent checks:
//  * the straggler chain's window probabilities against brute force over every slow/healthy path of a replica, and
//    the (B, W, lambda) condition against brute force over every pattern of three replicas;
//  * the loads of GC, SR-SGC and M-SGC at small parameters worked by hand (fractions);
//  * expected steps and the slowdown crossover of a two-replica job worked by hand;
//  * limits: persistent stragglers break every burst condition, so the sequential schemes never pay for them; at a
//    vanishing rate every scheme costs exactly its load; the rate crossover's ends separate paying from not;
//  * at scale: the healthy step is the step model's own (stragglers evicted), none's expected step the persistent
//    formula, the rows' layouts follow from the GPU count and batch;
//  * bad input named by flag.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/perf/cluster.h"
#include "megatrain/perf/coding_at_scale.h"
#include "megatrain/perf/coding_report.h"
#include "megatrain/perf/step_model.h"
#include "megatrain/perf/straggler_coding.h"
#include "megatrain/perf/straggler_coding_sim.h"
#include "megatrain/train/run_config.h"
#include "support/test_util.h"

using namespace mt;
using namespace mt::perf;
using mt::test::error_of;

namespace {

const std::string kA100 = std::string(MT_SOURCE_DIR) + "/configs/clusters/megascale-a100.toml";
const std::string k175B = std::string(MT_SOURCE_DIR) + "/configs/megascale-175b.toml";

StragglerProcess process(double rate, double duration, double slowdown = 0.1) {
  StragglerProcess p;
  p.rate = rate;
  p.duration = duration;
  p.slowdown = slowdown;
  return p;
}

// Probability of one replica's path (bit t = slow in round t) under the two-state chain, started stationary.
double path_probability(const StragglerProcess& p, unsigned path, int W) {
  const double a = p.start(), b = p.end();
  bool slow = path & 1;
  double prob = slow ? p.rate : 1 - p.rate;
  for (int t = 1; t < W; ++t) {
    const bool next = (path >> t) & 1;
    prob *= slow ? (next ? 1 - b : b) : (next ? a : 1 - a);
    slow = next;
  }
  return prob;
}

// Slow in the window's last round and in one of rounds 0 .. W-1-B.
bool breaks_burst(unsigned path, int B, int W) {
  if (!((path >> (W - 1)) & 1)) return false;
  for (int t = 0; t <= W - 1 - B; ++t)
    if ((path >> t) & 1) return true;
  return false;
}

// A two-replica healthy step: 1 s fixed, 2 s per unit of load.
const HealthyStep kStep{1, 2};

}  // namespace

TEST(StragglerCoding, WindowProbabilitiesMatchEveryPathOfTheChain) {
  for (const StragglerProcess& p : {process(0.2, 2), process(0.1, 1), process(0.3, 5), process(0.05, 0)}) {
    for (int W : {1, 2, 3, 5}) {
      EXPECT_NEAR(clean_probability(p, W), path_probability(p, 0, W), 1e-12) << "W " << W << " D " << p.duration;
      for (int B = 1; B < W; ++B) {
        double broken = 0;
        for (unsigned path = 0; path < (1u << W); ++path)
          if (breaks_burst(path, B, W)) broken += path_probability(p, path, W);
        EXPECT_NEAR(burst_violation_probability(p, B, W), broken, 1e-12) << "B " << B << " W " << W;
      }
    }
  }
  // Persistent: a replica slow now was slow in every earlier round, so every straggler breaks the burst condition.
  EXPECT_DOUBLE_EQ(burst_violation_probability(process(0.04, 0), 1, 4), 0.04);
  // One-round bursts never continue: a window of two rounds cannot hold a burst longer than one.
  EXPECT_NEAR(burst_violation_probability(process(0.2, 1), 1, 2), 0, 1e-15);
}

TEST(StragglerCoding, TheBurstyConditionMatchesEveryPatternOfThreeReplicas) {
  const int n = 3;
  for (const StragglerProcess& p : {process(0.25, 2), process(0.15, 1)}) {
    for (auto [B, W] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 3}}) {
      for (int lambda = 0; lambda <= n; ++lambda) {
        double ok = 0;
        const unsigned paths = 1u << W;
        for (unsigned x = 0; x < paths; ++x)
          for (unsigned y = 0; y < paths; ++y)
            for (unsigned z = 0; z < paths; ++z) {
              const int stragglers = (x != 0) + (y != 0) + (z != 0);
              if (stragglers > lambda || breaks_burst(x, B, W) || breaks_burst(y, B, W) || breaks_burst(z, B, W))
                continue;
              ok += path_probability(p, x, W) * path_probability(p, y, W) * path_probability(p, z, W);
            }
        EXPECT_NEAR(tolerated_probability(p, n, B, W, lambda), ok, 1e-12)
            << "B " << B << " W " << W << " lambda " << lambda;
      }
    }
  }
  // W = 1 is one round: GC's P(Binomial(n, r) <= s). n = 3, r = 0.25, s = 1: 0.75^3 + 3 x 0.25 x 0.75^2.
  EXPECT_NEAR(tolerated_probability(process(0.25, 2), 3, 1, 1, 1), 0.421875 + 0.421875, 1e-12);
}

TEST(StragglerCoding, TheSlowestReplicasSlowRoundsMatchEveryPathOfTwoReplicas) {
  const int m = 4, n = 2;
  for (const StragglerProcess& p : {process(0.2, 2), process(0.1, 1), process(0.3, 0)}) {
    const std::vector<double> dist = slow_rounds_distribution(p, m);
    double expected_max = 0, total = 0;
    std::vector<double> by_count(m + 1, 0);
    for (unsigned x = 0; x < (1u << m); ++x) {
      by_count[__builtin_popcount(x)] += path_probability(p, x, m);
      for (unsigned y = 0; y < (1u << m); ++y) {
        const double prob = path_probability(p, x, m) * path_probability(p, y, m);
        expected_max += prob * std::max(__builtin_popcount(x), __builtin_popcount(y));
        total += prob;
      }
    }
    EXPECT_NEAR(total, 1, 1e-12);
    for (int k = 0; k <= m; ++k) EXPECT_NEAR(dist[k], by_count[k], 1e-12) << "k " << k << " D " << p.duration;
    EXPECT_NEAR(expected_max_slow_rounds(p, n, m), expected_max, 1e-12) << "D " << p.duration;
  }
  // Persistent: the slowest replica is slow in every round unless all n are healthy.
  EXPECT_NEAR(expected_max_slow_rounds(process(0.04, 0), 16, 32), 32 * (1 - std::pow(0.96, 16)), 1e-9);
  // One-round bursts at a small rate: the slowest replica is slow about once, not once per round that has a straggler.
  const StragglerProcess p = process(0.001, 1);
  EXPECT_LT(expected_max_slow_rounds(p, 192, 32), 32 * (1 - std::pow(1 - p.rate, 192)) / 3);
}

TEST(StragglerCoding, LoadsAndDelaysOfThePapersSchemesAtSmallParameters) {
  CodingParams gc;
  gc.s = 2;
  EXPECT_EQ(coding_load(CodingScheme::GC, 8, gc), 3);
  EXPECT_EQ(coding_delay(CodingScheme::GC, gc), 0);
  // SR-SGC: s = ceil(B lambda / (W - 1 + B)). B 2, W 5, lambda 3: ceil(6 / 6) = 1; B 1, W 3, lambda 5: ceil(5/3) = 2.
  EXPECT_EQ(srsgc_s(2, 5, 3), 1);
  EXPECT_EQ(srsgc_s(1, 3, 5), 2);
  EXPECT_EQ(coding_load(CodingScheme::SRSGC, 8, CodingParams{0, 1, 3, 5}), 3);
  EXPECT_EQ(coding_delay(CodingScheme::SRSGC, CodingParams{0, 2, 5, 3}), 2);
  // M-SGC, n 4, B 1, W 3, lambda 1: (2 x 3) / (1 + 2 x 2) = 6/5; lambda = n: (W - 1 + B) / (W - 1) = 3/2; delay
  // W - 2 + B = 2. B 2, W 4, lambda 2: (3 x 5) / (2 + 3 x 3) = 15/11.
  EXPECT_DOUBLE_EQ(coding_load(CodingScheme::MSGC, 4, CodingParams{0, 1, 3, 1}), 6.0 / 5);
  EXPECT_DOUBLE_EQ(coding_load(CodingScheme::MSGC, 4, CodingParams{0, 1, 3, 4}), 3.0 / 2);
  EXPECT_DOUBLE_EQ(coding_load(CodingScheme::MSGC, 4, CodingParams{0, 2, 4, 2}), 15.0 / 11);
  EXPECT_EQ(coding_delay(CodingScheme::MSGC, CodingParams{0, 1, 3, 1}), 2);
  // M-SGC costs less than GC tolerating as many stragglers a round, and tends to 1 as the window grows.
  for (int lambda = 1; lambda <= 6; ++lambda) {
    EXPECT_LT(coding_load(CodingScheme::MSGC, 8, CodingParams{0, 1, 4, lambda}), lambda + 1);
    EXPECT_LT(coding_load(CodingScheme::MSGC, 8, CodingParams{0, 1, 400, lambda}), 1.003);
  }
}

TEST(StragglerCoding, ExpectedStepsAndTheSlowdownCrossoverOfTwoReplicasByHand) {
  // n 2, persistent rate 0.1, slowdown 0.5, H(L) = 1 + 2 L. none: falls back unless both healthy,
  // P = 1 - 0.81 = 0.19: 3 x (1 + 0.5 x 0.19) = 3.285. GC(1): falls back when both are slow, 0.01: 5 x 1.005.
  const StragglerProcess p = process(0.1, 0, 0.5);
  const SchemeOutcome none = evaluate_scheme(CodingScheme::None, {}, p, 2, 4, kStep);
  EXPECT_NEAR(none.p_fallback, 0.19, 1e-12);
  EXPECT_NEAR(none.step_seconds, 3.285, 1e-12);
  CodingParams gc;
  gc.s = 1;
  const SchemeOutcome gc1 = evaluate_scheme(CodingScheme::GC, gc, p, 2, 4, kStep);
  EXPECT_NEAR(gc1.p_fallback, 0.01, 1e-12);
  EXPECT_NEAR(gc1.step_seconds, 5.025, 1e-12);
  // GC(1) pays from d = (H(2) - H(1)) / (H(1) 0.19 - H(2) 0.01) = 2 / 0.52.
  const std::optional<double> d = paying_slowdown(CodingScheme::GC, gc, p, 2, 4, kStep);
  ASSERT_TRUE(d);
  EXPECT_NEAR(*d, 2 / 0.52, 1e-12);
  for (double f : {0.999, 1.001}) {
    const StragglerProcess q = process(0.1, 0, *d * f);
    const bool pays = evaluate_scheme(CodingScheme::GC, gc, q, 2, 4, kStep).step_seconds <
                      evaluate_scheme(CodingScheme::None, {}, q, 2, 4, kStep).step_seconds;
    EXPECT_EQ(pays, f > 1);
  }
}

TEST(StragglerCoding, PersistentStragglersNeverMakeTheSequentialSchemesPay) {
  // A persistent straggler straggled in every earlier round of the window, so it breaks the burst condition:
  // SR-SGC and M-SGC fall back exactly when none does, and cost their load on top.
  for (int n : {4, 16, 64})
    for (double r : {0.001, 0.04, 0.3}) {
      const StragglerProcess p = process(r, 0, 0.1);
      const double none = evaluate_scheme(CodingScheme::None, {}, p, n, 32, kStep).p_fallback;
      for (CodingScheme s : {CodingScheme::SRSGC, CodingScheme::MSGC}) {
        const std::optional<SchemeOutcome> best = best_sgc(s, p, n, 32, kStep);
        ASSERT_TRUE(best);
        EXPECT_NEAR(best->p_fallback, none, 1e-12) << scheme_name(s) << " n " << n << " r " << r;
        EXPECT_FALSE(paying_rates(s, {}, p, n, 32, kStep)) << scheme_name(s);
        EXPECT_FALSE(paying_slowdown(s, {}, p, n, 32, kStep)) << scheme_name(s);
      }
    }
}

TEST(StragglerCoding, AtAVanishingRateEverySchemeCostsItsLoad) {
  const StragglerProcess p = process(0, 2, 0.1);
  const double none = evaluate_scheme(CodingScheme::None, {}, p, 16, 32, kStep).step_seconds;
  EXPECT_DOUBLE_EQ(none, kStep.at(1));
  CodingParams gc;
  gc.s = 2;
  EXPECT_DOUBLE_EQ(evaluate_scheme(CodingScheme::GC, gc, p, 16, 32, kStep).step_seconds, kStep.at(3));
  const std::optional<SchemeOutcome> m = best_sgc(CodingScheme::MSGC, p, 16, 32, kStep);
  ASSERT_TRUE(m);
  // The cheapest M-SGC within the delay bound W - 2 + B <= 31: B 1, W 32, lambda 1: 2 x 32 / (1 + 31 x 2) = 64/63.
  EXPECT_DOUBLE_EQ(m->load, 64.0 / 63);
  EXPECT_DOUBLE_EQ(m->step_seconds, kStep.at(64.0 / 63));
  EXPECT_LE(m->delay, 31);
}

TEST(StragglerCoding, MoreStragglersNeverShortenTheUncodedStepAndMoreRedundancyFallsBackLess) {
  double prev = 0;
  for (double r : {0.0, 0.001, 0.01, 0.1, 0.5}) {
    const double step = evaluate_scheme(CodingScheme::None, {}, process(r, 0), 32, 8, kStep).step_seconds;
    EXPECT_GE(step, prev);
    prev = step;
  }
  double fallback = 2;
  for (int s = 0; s < 6; ++s) {
    CodingParams gc;
    gc.s = s;
    const double f = evaluate_scheme(CodingScheme::GC, gc, process(0.05, 3), 32, 8, kStep).p_fallback;
    EXPECT_LT(f, fallback);
    fallback = f;
  }
}

TEST(StragglerCoding, TheRateCrossoverSeparatesPayingFromNot) {
  // Short bursts that double a round, on many replicas: M-SGC's load is a few percent.
  const StragglerProcess p = process(0.001, 1, 1.0);
  const int n = 192, m = 32;
  const HealthyStep h{1.3, 6.9};
  const std::optional<RateInterval> r = paying_rates(CodingScheme::MSGC, {}, p, n, m, h);
  ASSERT_TRUE(r);
  auto step = [&](double rate) { return best_sgc(CodingScheme::MSGC, process(rate, 1, 1.0), n, m, h)->step_seconds; };
  auto gain = [&](double rate) {
    return evaluate_scheme(CodingScheme::None, {}, process(rate, 1, 1.0), n, m, h).step_seconds - step(rate);
  };
  EXPECT_LE(gain(r->from * 0.99), 0);
  EXPECT_GT(gain(r->from * 1.01), 0);
  EXPECT_GT(gain(r->to * 0.99), 0);
  EXPECT_LE(gain(r->to * 1.01), 0);
  EXPECT_GT(r->best_gain, 0);
  EXPECT_NEAR(r->best_gain, gain(r->best_rate) / step(r->best_rate), 1e-12);
  // The least paying slowdown over rates: at that rate and slowdown the scheme and none are even.
  const std::optional<SlowdownPoint> least = least_paying_slowdown(CodingScheme::MSGC, {}, p, n, m, h);
  ASSERT_TRUE(least);
  EXPECT_LT(least->slowdown, 1.0);
  for (double f : {0.99, 1.01}) {
    const StragglerProcess x = process(least->rate, 1, least->slowdown * f);
    const double g = evaluate_scheme(CodingScheme::None, {}, x, n, m, h).step_seconds -
                     best_sgc(CodingScheme::MSGC, x, n, m, h)->step_seconds;
    EXPECT_EQ(g > 0, f > 1) << f;
  }
}

TEST(StragglerCoding, TheSimulatedWaitingMatchesTheExactValuesAndStaysWithinTheBound) {
  // none: the simulation waits for every slow round of the slowest replica, E[max_i S_i] / m exactly (the DP).
  const int n = 8, m = 6, steps = 20000;
  const StragglerProcess p = process(0.1, 2);
  const SimulatedShare none = simulate_waited_share(CodingScheme::None, {}, p, n, m, steps, 7);
  EXPECT_NEAR(none.mean, expected_max_slow_rounds(p, n, m) / m, 5 * none.std_error);
  // (a step's rounds are correlated; 0.02 is about ten binomial standard errors of 120,000 rounds)
  EXPECT_NEAR(none.fallback, 1 - std::pow(1 - p.rate, n), 0.02);
  // Persistent stragglers: GC(1) waits every round exactly when more than one replica is slow.
  CodingParams gc;
  gc.s = 1;
  const StragglerProcess persistent = process(0.1, 0);
  const SimulatedShare g = simulate_waited_share(CodingScheme::GC, gc, persistent, n, m, steps, 7);
  EXPECT_NEAR(g.mean, evaluate_scheme(CodingScheme::GC, gc, persistent, n, m, kStep).waited_share, 5 * g.std_error);
  // Transient, M-SGC: the simulated waiting is within the upper bound min(P_fallback, E[max S] / m).
  const CodingParams q{0, 1, 4, 2};
  const SchemeOutcome bound = evaluate_scheme(CodingScheme::MSGC, q, p, n, m, kStep);
  const SimulatedShare sim = simulate_waited_share(CodingScheme::MSGC, q, p, n, m, steps, 7);
  EXPECT_LE(sim.mean, bound.waited_share + 5 * sim.std_error);
  EXPECT_LT(sim.mean, none.mean);  // it does wait less than none
  // Deterministic for a seed.
  EXPECT_EQ(simulate_waited_share(CodingScheme::MSGC, q, p, n, m, 100, 3).mean,
            simulate_waited_share(CodingScheme::MSGC, q, p, n, m, 100, 3).mean);
}

TEST(StragglerCoding, AtScaleTheHealthyStepIsTheStepModelsAndNoneWaitsForAnySlowReplica) {
  const Cluster c = load_cluster(kA100);
  const RunConfig cfg = load_run_config(k175B);
  Job job;
  job.model = cfg.model;
  job.layout.tp = cfg.parallel.tp;
  job.layout.pp = cfg.parallel.pp;
  job.layout.virtual_stages = cfg.parallel.virtual_stages;
  job.layout.micro_batch = cfg.data.batch_size;
  job.layout.seq = cfg.data.seq_len;
  CodingOptions o;
  o.gpus = {3072};
  o.sweep_durations = {};
  const CodingStudy s = coding_study(job, c, o);
  ASSERT_EQ(s.rows.size(), 1u);
  const CodingRow& row = s.rows[0];
  EXPECT_EQ(row.dp, 3072 / 64);
  EXPECT_EQ(row.microbatches, 6144 / 48);
  EXPECT_EQ(row.replica_nodes, 8);
  // The healthy step: the step model with the slow nodes evicted (misc), at m and 2m micro-batches.
  Job j = job;
  j.layout.dp = 48;
  j.layout.microbatches = 128;
  j.tech.misc = true;
  EXPECT_NEAR(row.healthy.at(1), predict_step_seconds(j, c), 1e-9);
  j.layout.microbatches = 256;
  EXPECT_NEAR(row.healthy.at(2), predict_step_seconds(j, c), 1e-9);
  // MegaScale's point: each replica of 8 nodes is slow with 1 - 0.995^8; none waits unless all 48 are healthy.
  double healthy = 1;
  for (int i = 0; i < 8; ++i) healthy *= 1 - c.straggler_node_fraction.value;
  EXPECT_NEAR(row.rate, 1 - healthy, 1e-12);
  const double all_healthy = std::pow(healthy, 48);
  EXPECT_NEAR(row.schemes[0].outcome.step_seconds,
              row.healthy.at(1) * (1 + c.straggler_slowdown.value * (1 - all_healthy)), 1e-9);
  EXPECT_TRUE(s.megascale);
  EXPECT_EQ(to_json(s, job, c)["rows"][0]["schemes"].size(), row.schemes.size());
}

TEST(StragglerCoding, BadInputIsNamedByItsFlag) {
  EXPECT_NE(error_of([] { validate_process(process(0.6, 1)); }).find("--straggler-rate"), std::string::npos);
  EXPECT_NE(error_of([] { validate_process(process(-0.1, 0)); }).find("--straggler-rate"), std::string::npos);
  EXPECT_NE(error_of([] { validate_process(process(0.1, 0.5)); }).find("--straggler-duration"), std::string::npos);
  EXPECT_NE(error_of([] { validate_process(process(0.1, 2, -1)); }).find("--straggler-slowdown"), std::string::npos);
  EXPECT_NE(error_of([] {
              evaluate_scheme(CodingScheme::SRSGC, CodingParams{0, 2, 4, 1}, process(0.1, 1), 8, 8, kStep);
            }).find("divide"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              evaluate_scheme(CodingScheme::MSGC, CodingParams{0, 2, 8, 1}, process(0.1, 1), 8, 8, kStep);
            }).find("delay"),
            std::string::npos);
  const Cluster c = load_cluster(kA100);
  Job job;
  job.model = load_run_config(k175B).model;
  job.layout.tp = job.layout.pp = 8;
  job.layout.seq = 2048;
  CodingOptions o;
  o.gpus = {1000};
  EXPECT_NE(error_of([&] { coding_study(job, c, o); }).find("--gpus 1000"), std::string::npos);
  o.gpus = {1024};
  o.global_batch = 100;
  EXPECT_NE(error_of([&] { coding_study(job, c, o); }).find("--batch 100"), std::string::npos);
}
