// Gradient coding (parallel/straggler_code.h) and straggler models (parallel/straggler_model.h) against independent
// checks:
//  * the models: inside_bursty_model against a brute-force oracle written in the other form of the definition (each
//    straggle against the rounds before it, distinct stragglers per clipped window), on every pattern of small sizes;
//  * decoding: for gc, sr-sgc and m-sgc, on n = 2..6, EVERY straggler pattern inside the scheme's model (depth-first,
//    one coder copy per branch) is accepted round by round without waiting, and the decoded coefficients count every
//    micro-batch of the global batch exactly once, which the test recomputes from the pieces' micro-batch lists (not
//    from the coder's block bookkeeping), and sums integer task values to the exact total;
//  * arbitrary patterns (mostly outside the models): a round is accepted exactly when the pattern stays inside the
//    model (the oracle again), and the decoded sum is still exact;
//  * floats: the decoded sum, computed as the runtime would (a worker sums its pieces, adds the kept ones, the
//    all-reduce sums the workers), is within the bound of any order of N = n m float additions:
//    |error| <= (N-1) u sum|g| / (1 - (N-1) u), u = 2^-24, against a long double reference;
//  * loads: the paper's formulas against hand-computed known answers; no round assigns more than the paper's load;
//    in steady state it assigns exactly that;
//  * metrics on a hand-worked sr-sgc step; the generator's determinism and conformance; bad input's messages.
#include <gtest/gtest.h>

#include "support/test_util.h"

#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/core/kind.h"
#include "megatrain/core/rng.h"
#include "megatrain/parallel/straggler_code.h"

using namespace mt;
using S = StragglerScheme;

namespace {

// The model in its round-by-round form: a straggle of w in round r may not follow one of w in rounds r-W+1..r-B,
// and every window [a, a+W-1] clipped to the pattern holds at most lambda distinct stragglers.
bool oracle_bursty(const StragglerPattern& p, const BurstyModel& m) {
  const int rounds = static_cast<int>(p.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t w = 0; w < p[r].size(); ++w) {
      if (!p[r][w]) continue;
      for (int q = std::max(0, r - m.W + 1); q <= r - m.B; ++q) {
        if (p[q][w]) return false;
      }
    }
  }
  for (int a = -m.W + 1; a < rounds; ++a) {
    std::set<size_t> seen;
    for (int r = std::max(0, a); r < std::min(rounds, a + m.W); ++r) {
      for (size_t w = 0; w < p[r].size(); ++w) {
        if (p[r][w]) seen.insert(w);
      }
    }
    if (static_cast<int>(seen.size()) > m.lambda) return false;
  }
  return true;
}

std::vector<bool> bits(int mask, int n) {
  std::vector<bool> b(n);
  for (int w = 0; w < n; ++w) b[w] = (mask >> w) & 1;
  return b;
}

// Checks a finished step: kept pieces arrived, every micro-batch counted once, the integer sum exact, no round over
// the paper's load. Returns a failure description, "" when right.
std::string check_decoding(const StragglerCode& code) {
  const Decoding d = code.decode();
  const int total = code.global_microbatches();
  std::vector<int> count(total, 0);
  // Task values: distinct, large, so a double count or a miss changes the sum.
  const auto value = [](int k) { return int64_t{1000003} * k * k + 17 * k + 5; };
  int64_t decoded = 0, expected = 0;
  for (int k = 0; k < total; ++k) expected += value(k);
  const Fraction limit = paper_load(code.config(), code.workers());
  for (size_t r = 0; r < code.history().size(); ++r) {
    for (int w = 0; w < code.workers(); ++w) {
      const auto& pieces = code.history()[r][w];
      int64_t assigned = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        assigned += static_cast<int64_t>(pieces[i].microbatches.size());
        const int c = d.coefficient[r][w][i];
        if (c != 0 && code.pattern()[r][w]) return fmt::format("round {} worker {}: a lost piece is used", r, w);
        for (int k : pieces[i].microbatches) {
          count[k] += c;
          decoded += c * value(k);
        }
      }
      if (!(Fraction::of(assigned, code.job_microbatches()) <= limit)) {
        return fmt::format("round {} worker {}: {} micro-batches, over the paper's load", r, w, assigned);
      }
    }
  }
  for (int k = 0; k < total; ++k) {
    if (count[k] != 1) return fmt::format("micro-batch {} counted {} times", k, count[k]);
  }
  if (decoded != expected) return fmt::format("sum {} != {}", decoded, expected);
  return "";
}

// Runs every pattern inside the model, depth first; returns the number of complete patterns checked.
int64_t every_pattern_inside(const StragglerCode& start) {
  int64_t leaves = 0;
  std::function<void(const StragglerCode&)> walk = [&](const StragglerCode& code) {
    if (code.round() == code.rounds()) {
      const std::string why = check_decoding(code);
      EXPECT_EQ(why, "") << to_string(code.pattern());
      ++leaves;
      return;
    }
    for (int mask = 0; mask < (1 << code.workers()); ++mask) {
      StragglerPattern p = code.pattern();
      p.push_back(bits(mask, code.workers()));
      if (!code.inside_model(p)) continue;
      StragglerCode next = code;
      const RoundOutcome o = next.record(p.back());
      if (o != RoundOutcome::Accepted) {
        ADD_FAILURE() << "inside the model, yet waited:\n" << to_string(p);
        return;
      }
      walk(next);
    }
  };
  walk(start);
  return leaves;
}

StragglerCodeConfig gc(int s) { return {S::Gc, s, {}}; }
StragglerCodeConfig sgc(S scheme, int B, int W, int lambda) { return {scheme, 0, {B, W, lambda}}; }

}  // namespace

TEST(StragglerModel, BurstyCheckAgreesWithTheRoundByRoundOracleOnEveryPattern) {
  int inside = 0, outside = 0;
  for (int n : {2, 3, 4}) {
    for (int rounds : {1, 3, 4, 5, 6}) {
      if (n * rounds > 12) continue;
      for (BurstyModel m : {BurstyModel{1, 2, 1}, BurstyModel{1, 3, 2}, BurstyModel{2, 3, 1}, BurstyModel{2, 4, 2}}) {
        if (m.lambda > n) continue;
        for (int mask = 0; mask < (1 << (n * rounds)); ++mask) {
          StragglerPattern p(rounds, std::vector<bool>(n));
          for (int r = 0; r < rounds; ++r) p[r] = bits(mask >> (r * n), n);
          const bool want = oracle_bursty(p, m);
          ASSERT_EQ(inside_bursty_model(p, m), want) << "B " << m.B << " W " << m.W << "\n" << to_string(p);
          EXPECT_EQ(bursty_violation(p, m).empty(), want);
          (want ? inside : outside)++;
        }
      }
    }
  }
  EXPECT_GT(inside, 1000);  // both answers are exercised
  EXPECT_GT(outside, 1000);
}

TEST(StragglerModel, PerRoundModelCountsStragglersOfEachRound) {
  const StragglerPattern p{{true, false, true}, {false, false, false}, {true, false, false}};
  EXPECT_TRUE(inside_per_round_model(p, 2));
  EXPECT_FALSE(inside_per_round_model(p, 1));
}

TEST(StragglerModel, GeneratorIsDeterministicConformsAndProducesBursts) {
  const BurstyModel m{2, 5, 2};
  int straggles = 0, longest = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const StragglerPattern p = bursty_pattern(6, 40, m, 0.2, seed);
    ASSERT_TRUE(oracle_bursty(p, m)) << "seed " << seed << "\n" << to_string(p);
    EXPECT_EQ(p, bursty_pattern(6, 40, m, 0.2, seed));
    for (int w = 0; w < 6; ++w) {
      int run = 0;
      for (int r = 0; r < 40; ++r) {
        run = p[r][w] ? run + 1 : 0;
        longest = std::max(longest, run);
        straggles += p[r][w];
      }
    }
  }
  EXPECT_NE(bursty_pattern(6, 40, m, 0.2, 1), bursty_pattern(6, 40, m, 0.2, 2));
  EXPECT_GT(straggles, 1000);
  EXPECT_EQ(longest, m.B);  // bursts reach B and never exceed it
  EXPECT_EQ(to_string(bursty_pattern(6, 40, m, 0.0, 3)), "(no stragglers)");
}

TEST(StragglerCode, LoadsAreThePapersFormulas) {
  // Known answers worked by hand from the formulas in the header.
  EXPECT_EQ(paper_load(gc(1), 4), Fraction::of(1, 2));
  EXPECT_EQ(paper_load(gc(2), 6), Fraction::of(1, 2));
  EXPECT_EQ(paper_load({S::None, 0, {}}, 4), Fraction::of(1, 4));
  // sr-sgc, B = 1, W = 2, lambda = 2: s = ceil(2 / 2) = 1, load 2/4.
  EXPECT_EQ(paper_load(sgc(S::SrSgc, 1, 2, 2), 4), Fraction::of(1, 2));
  // sr-sgc, B = 1, W = 3, lambda = 2: s = ceil(2 / 3) = 1, load 2/6 (gc needs s = 2, load 3/6, for the same pattern).
  EXPECT_EQ(paper_load(sgc(S::SrSgc, 1, 3, 2), 6), Fraction::of(1, 3));
  // m-sgc, n = 4, B = 1, W = 2, lambda = 1: (2 * 2) / (4 * (1 + 1 * 2)) = 4/12.
  EXPECT_EQ(paper_load(sgc(S::MSgc, 1, 2, 1), 4), Fraction::of(1, 3));
  // m-sgc, n = 6, B = 2, W = 3, lambda = 2: (3 * 4) / (6 * (2 + 2 * 3)) = 12/48.
  EXPECT_EQ(paper_load(sgc(S::MSgc, 2, 3, 2), 6), Fraction::of(1, 4));
  // m-sgc, lambda = n = 2, B = 1, W = 3: (3 - 1 + 1) / (2 * 2) = 3/4.
  EXPECT_EQ(paper_load(sgc(S::MSgc, 1, 3, 2), 2), Fraction::of(3, 4));
}

TEST(StragglerCode, SteadyStateRoundsAssignExactlyThePapersLoad) {
  struct Case {
    StragglerCodeConfig c;
    int n, m;
  };
  for (const Case& k : {Case{gc(1), 4, 3}, Case{sgc(S::SrSgc, 1, 2, 2), 4, 3}, Case{sgc(S::MSgc, 1, 2, 1), 4, 9},
                        Case{sgc(S::MSgc, 2, 3, 2), 6, 32}}) {
    StragglerCode code(k.c, k.n, k.m);
    while (code.round() < code.rounds()) code.record(std::vector<bool>(k.n, false));
    EXPECT_EQ(code.metrics().peak_load, paper_load(k.c, k.n)) << kind_name(k.c.scheme);
    EXPECT_EQ(check_decoding(code), "");
  }
}

TEST(StragglerCode, GcDecodesEveryPatternOfAtMostSStragglersPerRound) {
  int64_t leaves = 0;
  for (int n = 2; n <= 6; ++n) {
    for (int s = 0; s < n; ++s) {
      if (n % (s + 1) != 0) continue;
      for (int m = 1; m <= (n >= 5 ? 2 : 3); ++m) leaves += every_pattern_inside(StragglerCode(gc(s), n, m));
    }
  }
  EXPECT_GT(leaves, 5000);
}

TEST(StragglerCode, UncodedToleratesNoStraggler) {
  for (int n = 2; n <= 6; ++n) {
    for (int m = 1; m <= 4; ++m) {
      StragglerCode code({S::None, 0, {}}, n, m);
      EXPECT_EQ(every_pattern_inside(code), 1);  // only the pattern without stragglers
      std::vector<bool> one(n, false);
      one[n - 1] = true;
      EXPECT_EQ(code.record(one), RoundOutcome::WaitedOutsideModel);
    }
  }
}

TEST(StragglerCode, SrSgcDecodesEveryBurstyPatternWithinDelayB) {
  int64_t leaves = 0;
  int cases = 0;
  for (int n = 2; n <= 6; ++n) {
    for (int B : {1, 2}) {
      for (int W : {B + 1, 2 * B + 1, 3 * B + 1}) {
        for (int lambda = 1; lambda <= n; ++lambda) {
          const StragglerCodeConfig c = sgc(S::SrSgc, B, W, lambda);
          const int s = (B * lambda + W - 2 + B) / (W - 1 + B);
          if (s >= n || n % (s + 1) != 0) continue;
          for (int m = B + 1; m <= (n >= 5 ? 3 : 4); ++m) {
            if ((m + B) * n > 24) continue;  // the widest enumeration kept within seconds
            leaves += every_pattern_inside(StragglerCode(c, n, m));
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 30);
  EXPECT_GT(leaves, 10000);
}

TEST(StragglerCode, MSgcDecodesEveryBurstyPatternWithinDelayWMinus2PlusB) {
  int64_t leaves = 0;
  int cases = 0;
  for (int n = 2; n <= 6; ++n) {
    for (int W : {2, 3}) {
      for (int B = 1; B < W; ++B) {
        for (int lambda = 1; lambda <= n; ++lambda) {
          if (lambda < n && n % (lambda + 1) != 0) continue;
          const StragglerCodeConfig c = sgc(S::MSgc, B, W, lambda);
          const int per_worker = lambda < n ? (W - 1) * (lambda + 1) + B : W - 1;
          for (int jobs = 1; jobs <= 2; ++jobs) {
            if ((jobs + W - 2 + B) * n > 20) continue;
            leaves += every_pattern_inside(StragglerCode(c, n, jobs * per_worker));
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 20);
  EXPECT_GT(leaves, 10000);
}

TEST(StragglerCode, PatternsOutsideTheModelWaitAndNeverDecodeWrong) {
  struct Case {
    StragglerCodeConfig c;
    int n, m;
  };
  const std::vector<Case> cases{{gc(1), 4, 4},
                                {gc(2), 6, 3},
                                {sgc(S::SrSgc, 1, 2, 2), 4, 4},
                                {sgc(S::SrSgc, 2, 5, 3), 6, 4},
                                {sgc(S::MSgc, 1, 2, 1), 4, 6},
                                {sgc(S::MSgc, 2, 3, 2), 6, 16},
                                {sgc(S::MSgc, 1, 3, 3), 3, 6}};
  int waited = 0, accepted_with_stragglers = 0;
  for (const Case& k : cases) {
    for (uint64_t seed = 0; seed < 300; ++seed) {
      Rng rng(seed);
      StragglerCode code(k.c, k.n, k.m);
      int waits = 0;
      std::vector<std::vector<KeptPiece>> early;
      while (code.round() < code.rounds()) {
        std::vector<bool> st(k.n);
        for (int w = 0; w < k.n; ++w) st[w] = rng.uniform() < 0.3f;
        StragglerPattern p = code.pattern();
        p.push_back(st);
        const bool inside = k.c.scheme == S::Gc ? inside_per_round_model(p, k.c.s) : oracle_bursty(p, k.c.bursty);
        const RoundOutcome o = code.record(st);
        ASSERT_EQ(o, inside ? RoundOutcome::Accepted : RoundOutcome::WaitedOutsideModel) << to_string(p);
        if (!inside) ++waited, ++waits;
        if (inside && std::count(st.begin(), st.end(), true) > 0) ++accepted_with_stragglers;
        const int due = code.round() - 1 - code.delay();  // the job whose deadline was this round
        if (due >= 0) early.push_back(code.job_decoding(due));
      }
      ASSERT_EQ(check_decoding(code), "") << to_string(code.pattern());
      // What each job's decoding said at its deadline is what the step's decoding says at the end.
      const Decoding d = code.decode();
      ASSERT_EQ(static_cast<int>(early.size()), code.jobs());
      size_t kept = 0, ones = 0;
      for (const auto& job : early) {
        kept += job.size();
        for (const KeptPiece& k : job) EXPECT_EQ(d.coefficient[k.round][k.worker][k.index], 1);
      }
      for (const auto& round : d.coefficient) {
        for (const auto& worker : round) ones += std::count(worker.begin(), worker.end(), 1);
      }
      EXPECT_EQ(kept, ones);
      EXPECT_EQ(code.metrics().rounds_waited, waits);
    }
  }
  EXPECT_GT(waited, 1000);
  EXPECT_GT(accepted_with_stragglers, 500);
}

TEST(StragglerCode, FloatDecodingIsWithinTheBoundOfAnySummationOrder) {
  // Each worker sums its kept pieces into one buffer (a piece is itself a float sum of its micro-batches), then the
  // all-reduce sums the buffers in worker order: N = n m gradients, each added once, through N - 1 additions in
  // some tree. Any such tree's error is at most gamma_{N-1} sum |g| (Higham, Accuracy and Stability of Numerical
  // Algorithms, the bound of summation along a tree of height h <= N - 1).
  const int n = 6, m = 16, dim = 64;
  StragglerCode code(sgc(S::MSgc, 2, 3, 2), n, m);
  const StragglerPattern stragglers = bursty_pattern(n, code.rounds(), code.config().bursty, 0.3, 7);
  for (int r = 0; r < code.rounds(); ++r) ASSERT_EQ(code.record(stragglers[r]), RoundOutcome::Accepted);
  ASSERT_GT(code.metrics().stragglers, 0);
  const int total = code.global_microbatches();
  Rng rng(11);
  std::vector<std::vector<float>> g(total, std::vector<float>(dim));
  for (auto& v : g) {
    for (float& x : v) x = rng.normal() * 3.0f;
  }
  const Decoding d = code.decode();
  std::vector<std::vector<float>> buffer(n, std::vector<float>(dim, 0.0f));
  for (size_t r = 0; r < code.history().size(); ++r) {
    for (int w = 0; w < n; ++w) {
      for (size_t i = 0; i < code.history()[r][w].size(); ++i) {
        if (d.coefficient[r][w][i] == 0) continue;  // skipped, never multiplied (an abandoned piece may be NaN)
        std::vector<float> piece(dim, 0.0f);
        for (int k : code.history()[r][w][i].microbatches) {
          for (int e = 0; e < dim; ++e) piece[e] += g[k][e];
        }
        for (int e = 0; e < dim; ++e) buffer[w][e] += piece[e];
      }
    }
  }
  const double u = std::ldexp(1.0, -24), gamma = (total - 1) * u / (1 - (total - 1) * u);
  for (int e = 0; e < dim; ++e) {
    float reduced = 0;
    long double exact = 0, magnitude = 0;
    for (int w = 0; w < n; ++w) reduced += buffer[w][e];
    for (int k = 0; k < total; ++k) {
      exact += g[k][e];
      magnitude += std::fabs(g[k][e]);
    }
    EXPECT_LE(std::fabs(static_cast<long double>(reduced) - exact), gamma * magnitude) << "element " << e;
  }
}

TEST(StragglerCode, SrSgcReattemptsTheLowestMissingWorkersAndCountsThem) {
  // n = 4, B = 1, W = 2, lambda = 2: s = 1, blocks {0, 1} and {2, 3} of each round's micro-batches. Workers 0 and 1
  // straggle in round 0 (v = 2 > s): v - s = 1 worker, the lowest, reattempts its own job-0 piece in round 1, so
  // job 0 is decoded at its deadline from workers 2 (or 3) and 0; job 1 then lacks only worker 0 (v = 1 = s).
  StragglerCode code(sgc(S::SrSgc, 1, 2, 2), 4, 2);
  ASSERT_EQ(code.rounds(), 3);
  EXPECT_EQ(code.record({true, true, false, false}), RoundOutcome::Accepted);
  ASSERT_EQ(code.tasks()[0].size(), 1u);
  EXPECT_EQ(code.tasks()[0][0].job, 0);
  EXPECT_TRUE(code.tasks()[0][0].repeat);
  EXPECT_EQ(code.tasks()[0][0].microbatches, (std::vector<int>{0, 1}));
  EXPECT_EQ(code.tasks()[1][0].job, 1);
  // Worker 1 straggling again is a burst of 2 > B: outside the model, so the round waits.
  EXPECT_EQ(code.record({false, true, false, false}), RoundOutcome::WaitedOutsideModel);
  for (const auto& t : code.tasks()) EXPECT_TRUE(t.empty());  // round 2: nothing owed
  EXPECT_EQ(code.record({false, false, false, false}), RoundOutcome::Accepted);
  const StragglerMetrics mt = code.metrics();
  EXPECT_EQ(mt.stragglers, 2);
  EXPECT_EQ(mt.rounds_waited, 1);
  EXPECT_EQ(mt.microbatches_recomputed, 2);
  EXPECT_EQ(mt.microbatches_computed, 16);      // 4 workers x 2 micro-batches x 2 rounds
  EXPECT_DOUBLE_EQ(mt.redundancy, 16.0 / 8.0);  // against the uncoded 4 x 2
  EXPECT_EQ(check_decoding(code), "");
}

TEST(StragglerCode, MSgcRepeatsALostD1ChunkOnTheSameWorker) {
  // n = 4, B = 1, W = 2, lambda = 1, one job (m = 3): slot 0 is the D1 chunk, slot 1 the D2 piece. Worker 2 straggles
  // in round 0, so in round 1 it repeats its D1 chunk instead of its D2 piece; D2's block {2, 3} still arrives from
  // worker 3.
  StragglerCode code(sgc(S::MSgc, 1, 2, 1), 4, 3);
  ASSERT_EQ(code.jobs(), 1);
  ASSERT_EQ(code.rounds(), 2);
  EXPECT_EQ(code.tasks()[2][0].microbatches, (std::vector<int>{4, 5}));
  EXPECT_EQ(code.record({false, false, true, false}), RoundOutcome::Accepted);
  EXPECT_EQ(code.tasks()[2][0].microbatches, (std::vector<int>{4, 5}));
  EXPECT_TRUE(code.tasks()[2][0].repeat);
  EXPECT_EQ(code.tasks()[3][0].microbatches, (std::vector<int>{10, 11}));
  EXPECT_EQ(code.record({false, false, false, false}), RoundOutcome::Accepted);
  EXPECT_EQ(code.metrics().microbatches_recomputed, 2);
  EXPECT_EQ(check_decoding(code), "");
}

TEST(StragglerCode, TimingHelpersFollowTheDeadlineRule) {
  const std::vector<double> t{1.0, 1.1, 2.5, 1.3};
  EXPECT_EQ(late_workers(t, 0.2), (std::vector<bool>{false, false, true, true}));
  EXPECT_DOUBLE_EQ(round_time_saved(t, {false, false, true, true}, RoundOutcome::Accepted), 2.5 - 1.1);
  EXPECT_DOUBLE_EQ(round_time_saved(t, {false, false, true, true}, RoundOutcome::WaitedOutsideModel), 0.0);
}

TEST(StragglerCode, BadSettingsAreConfigErrorsNamingTheKey) {
  using test::error_of;
  using test::has;
  StragglerScheme k = S::None;
  EXPECT_TRUE(has(error_of([&] { parse_kind("parallel.straggler_coding", "sgc", k); }), "parallel.straggler_coding"));
  parse_kind("parallel.straggler_coding", "m-sgc", k);
  EXPECT_EQ(k, S::MSgc);
  EXPECT_TRUE(has(error_of([] { StragglerCode(gc(1), 3, 2); }), "divide the 3 data-parallel"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(gc(4), 4, 2); }), "parallel.straggler_s"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(sgc(S::SrSgc, 2, 4, 2), 4, 2); }),
                  "divide parallel.straggler_window - 1"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(sgc(S::MSgc, 1, 2, 1), 4, 4); }),
                  "train.grad_accum = 4 must be a multiple of 3"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(sgc(S::MSgc, 2, 2, 1), 4, 4); }), "parallel.straggler_window"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(sgc(S::MSgc, 1, 2, 5), 4, 4); }), "parallel.straggler_lambda"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(gc(0), 4, 0); }), "train.grad_accum"));
  EXPECT_TRUE(has(error_of([] { StragglerCode(sgc(S::SrSgc, 2, 3, 1), 4, 2); }), "at most train.grad_accum - 1 = 1"));
  EXPECT_TRUE(has(error_of([] { bursty_pattern(4, 10, {1, 2, 1}, 1.5, 0); }), "start probability"));
  StragglerCode code(gc(1), 4, 1);
  EXPECT_TRUE(has(error_of([&] { code.record({false}); }), "1 entries for 4 replicas"));
  EXPECT_TRUE(has(error_of([&] { code.decode(); }), "before the step's last round"));
  EXPECT_TRUE(has(error_of([&] { code.job_decoding(0); }), "job 0 is due at the end of round 0"));
}
