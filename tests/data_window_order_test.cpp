// WindowOrder, the shuffled order of an epoch's windows, against what a uniformly random permutation would give.
// Every check is deterministic (fixed seeds, integer arithmetic), so the bounds below are not about flakiness: each
// states how far a truly random permutation strays with a tiny probability (given beside it), and a weak shuffle
// (identity, a rotation, a stride, too few rounds) lands far outside it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "megatrain/data/window_order.h"

namespace mt {
namespace {

TEST(WindowOrder, IsABijectionOfZeroToNForEverySize) {
  // Sizes at and around powers of two and four (the Feistel domain's edges), primes, and the smallest ones.
  for (uint64_t n : {1ull,  2ull,  3ull,  4ull,   5ull,    7ull,    8ull,    15ull,   16ull,    17ull,
                     63ull, 64ull, 65ull, 100ull, 1000ull, 4095ull, 4096ull, 4097ull, 65537ull, 262143ull}) {
    for (uint64_t seed : {0ull, 1ull, 42ull}) {
      for (uint64_t epoch : {0ull, 7ull}) {
        WindowOrder order(n, seed, epoch);
        std::vector<char> seen(n, 0);
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t w = order(i);
          ASSERT_LT(w, n) << "n " << n << " seed " << seed << " epoch " << epoch << " i " << i;
          ASSERT_FALSE(seen[w]) << "window " << w << " visited twice (n " << n << ")";
          seen[w] = 1;
        }
      }
    }
  }
}

TEST(WindowOrder, HugeDatasetsNeedNoMemoryAndStayInRange) {
  // 2^40 + 3 windows (2.2e15 tokens at T = 2048): positions spread over the range, no two the same.
  const uint64_t n = (uint64_t{1} << 40) + 3;
  WindowOrder order(n, 3, 0);
  std::set<uint64_t> seen;
  uint64_t above_half = 0;
  for (uint64_t i = 0; i < 4000; ++i) {
    const uint64_t w = order(i * 274877906ull);  // positions all over the epoch
    ASSERT_LT(w, n);
    seen.insert(w);
    above_half += w >= n / 2;
  }
  EXPECT_EQ(seen.size(), 4000u);
  // Binomial(4000, 1/2): mean 2000, sd 31.6; 6 sd is a 2e-9 chance.
  EXPECT_NEAR(double(above_half), 2000.0, 6 * 31.6);
}

TEST(WindowOrder, DependsOnlyOnSeedAndEpoch) {
  const uint64_t n = 10000;
  WindowOrder a(n, 5, 2), same(n, 5, 2), next_epoch(n, 5, 3), other_seed(n, 6, 2);
  int agree_epoch = 0, agree_seed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a(i), same(i));
    agree_epoch += a(i) == next_epoch(i);
    agree_seed += a(i) == other_seed(i);
  }
  // Two independent permutations agree at Poisson(1) positions: more than 10 is a 1e-8 chance.
  EXPECT_LE(agree_epoch, 10);
  EXPECT_LE(agree_seed, 10);
}

TEST(WindowOrder, LooksLikeARandomPermutation) {
  const uint64_t n = 100000;
  WindowOrder order(n, 11, 0);
  double sum_xy = 0;
  int fixed = 0, runs = 0;
  uint64_t prev = order(0);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t w = order(i);
    sum_xy += (double(i) - (n - 1) / 2.0) * (double(w) - (n - 1) / 2.0);
    fixed += w == i;
    if (i > 0) runs += w == prev + 1;  // consecutive positions reading consecutive windows
    prev = w;
  }
  // Spearman's rank correlation of position and window (both are ranks): sd 1/sqrt(n-1) = 0.00316 for a random
  // permutation; 6 sd (0.019) is a 2e-9 chance. An unshuffled or rotated order gives ~1, a reversed one -1.
  const double var = (double(n) * n - 1) / 12.0;
  const double rho = sum_xy / (n * var);
  EXPECT_LT(std::abs(rho), 6.0 / std::sqrt(double(n - 1))) << "rho " << rho;
  // Fixed points and "next window follows" pairs are each about Poisson(1): more than 10 is a 1e-8 chance.
  EXPECT_LE(fixed, 10);
  EXPECT_LE(runs, 10);
}

TEST(WindowOrder, EachWindowIsEquallyLikelyToComeFirst) {
  // Over 20,000 (seed, epoch) keys, which of 10 windows comes first: Pearson's chi-square with 9 degrees of
  // freedom exceeds 45 with probability 9e-7 for a uniform choice.
  const uint64_t n = 10;
  std::vector<double> count(n, 0);
  const int keys = 20000;
  for (int k = 0; k < keys; ++k) count[WindowOrder(n, k / 4, k % 4)(0)] += 1;
  double chi2 = 0;
  for (double c : count) chi2 += (c - keys / double(n)) * (c - keys / double(n)) / (keys / double(n));
  EXPECT_LT(chi2, 45.0) << "chi2 " << chi2;
}

}  // namespace
}  // namespace mt
