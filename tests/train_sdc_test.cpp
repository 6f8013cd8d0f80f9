// The pure half of the silent-data-corruption check (train/sdc_verdict.h): the parameter hash against known
// answers and its guarantee that one flipped bit changes it; the replicas' verdict against known answers for
// dp = 2, 3 and 4 with none, one and two odd replicas.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/core/fault_spec.h"
#include "megatrain/core/bits_hash.h"
#include "megatrain/train/sdc_verdict.h"

using namespace mt;

namespace {

float flip_bit(float x, int bit) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  b ^= 1u << bit;
  std::memcpy(&x, &b, sizeof b);
  return x;
}

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i) - 0.5f;  // exact in fp32: no rounding
  return v;
}

}  // namespace

// Known answers from an independent implementation of the definition in core/bits_hash.h (a few lines of Python
// over the floats' bits, with 64-bit wrap-around), frozen: a change of the hash shows here.
TEST(SdcHash, MatchesItsKnownAnswers) {
  EXPECT_EQ(param_hash(nullptr, 0), 0xf52a15e9a9b5e89bull);
  const std::vector<float> v = ramp(7);  // -0.5, -0.25, ..., 1.0
  EXPECT_EQ(param_hash(v.data(), v.size()), 0x4f88a318753ed424ull);
}

// Past 2^20 words the sum runs on the OpenMP threads; a single-threaded sum of the same terms (written here) is the
// oracle: any split of an exact modular sum gives the same bits.
TEST(SdcHash, TheThreadedSumIsTheSerialOne) {
  std::vector<float> v(3'000'017);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1013) * 0.125f - 7.0f;
  uint64_t s = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t w;
    std::memcpy(&w, &v[i], 4);
    s += bits_hash_term(w, i);
  }
  EXPECT_EQ(param_hash(v.data(), v.size()), bits_hash_finish(s, v.size()));
}

TEST(SdcHash, AnyOneFlippedBitOfAnyWeightChangesIt) {
  const std::vector<float> v = ramp(37);
  const uint64_t base = param_hash(v.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i)
    for (int bit = 0; bit < 32; ++bit) {
      std::vector<float> w = v;
      w[i] = flip_bit(w[i], bit);
      ASSERT_NE(param_hash(w.data(), w.size()), base) << "element " << i << " bit " << bit;
    }
}

TEST(SdcHash, SeesTheBitsNotTheValues) {
  const float zero = 0.0f, minus_zero = -0.0f;
  EXPECT_NE(param_hash(&zero, 1), param_hash(&minus_zero, 1));  // equal as numbers, not as bits
  const std::vector<float> v = ramp(8);
  EXPECT_NE(param_hash(v.data(), 7), param_hash(v.data(), 8));  // the count counts
  EXPECT_EQ(param_hash(v.data(), 8), param_hash(ramp(8).data(), 8));
}

TEST(SdcHash, CombiningIsOrderSensitiveAndSeesEveryTensor) {
  const uint64_t a = 0x1111, b = 0x2222;
  EXPECT_NE(combine_hash(combine_hash(kHashSeed, a), b), combine_hash(combine_hash(kHashSeed, b), a));
  EXPECT_NE(combine_hash(combine_hash(kHashSeed, a), b), combine_hash(combine_hash(kHashSeed, a), b ^ (1ull << 63)));
}

TEST(SdcVerdict, AgreeingReplicasAgreeForDp2To4) {
  for (size_t dp : {2u, 3u, 4u}) {
    const ReplicaVerdict v = judge_replicas(std::vector<uint64_t>(dp, 7));
    EXPECT_TRUE(v.agree);
    EXPECT_FALSE(v.no_majority);
    EXPECT_EQ(v.majority, 7u);
    EXPECT_TRUE(v.odd.empty());
  }
}

TEST(SdcVerdict, Dp2DisagreeingNamesThePairWithoutAMajority) {
  const ReplicaVerdict v = judge_replicas({7, 8});
  EXPECT_FALSE(v.agree);
  EXPECT_TRUE(v.no_majority);
  EXPECT_EQ(v.odd, (std::vector<int>{0, 1}));
}

TEST(SdcVerdict, Dp3NamesTheOneOddReplicaByMajority) {
  for (int odd = 0; odd < 3; ++odd) {
    std::vector<uint64_t> h(3, 7);
    h[static_cast<size_t>(odd)] = 9;
    const ReplicaVerdict v = judge_replicas(h);
    EXPECT_FALSE(v.agree);
    EXPECT_FALSE(v.no_majority);
    EXPECT_EQ(v.majority, 7u);
    EXPECT_EQ(v.odd, (std::vector<int>{odd}));
  }
}

TEST(SdcVerdict, Dp3WithTwoOddReplicasHasNoMajority) {
  const ReplicaVerdict v = judge_replicas({7, 8, 9});
  EXPECT_TRUE(v.no_majority);
  EXPECT_EQ(v.odd, (std::vector<int>{0, 1, 2}));
}

TEST(SdcVerdict, Dp4NamesOneOrTwoOddReplicasAgainstAPlurality) {
  ReplicaVerdict v = judge_replicas({7, 7, 9, 7});
  EXPECT_FALSE(v.no_majority);
  EXPECT_EQ(v.majority, 7u);
  EXPECT_EQ(v.odd, (std::vector<int>{2}));
  v = judge_replicas({8, 7, 9, 7});  // two odd replicas that differ from each other too: 2 against 1 + 1
  EXPECT_FALSE(v.no_majority);
  EXPECT_EQ(v.majority, 7u);
  EXPECT_EQ(v.odd, (std::vector<int>{0, 2}));
}

TEST(SdcVerdict, Dp4SplitTwoAgainstTwoHasNoMajority) {
  const ReplicaVerdict v = judge_replicas({7, 9, 9, 7});
  EXPECT_TRUE(v.no_majority);
  EXPECT_EQ(v.odd, (std::vector<int>{0, 1, 2, 3}));
}

TEST(SdcFaultSpec, BitflipTakesARankAndAStep) {
  const std::vector<Fault> f = parse_faults("bitflip:rank=1:step=6");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, FaultKind::BitFlip);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[0].step, 6);
  EXPECT_STREQ(fault_kind_name(f[0].kind), "bitflip");
  EXPECT_THROW(parse_faults("bitflip:rank=1"), Error);
}

TEST(SdcRerunVerdict, EqualHashListsReproduce) {
  const RerunVerdict v = judge_rerun({1, 0, 3}, {1, 0, 3});
  EXPECT_TRUE(v.reproduced);
  EXPECT_EQ(v.first_differing, -1);
  EXPECT_TRUE(judge_rerun({}, {}).reproduced);  // nothing compared: nothing differs
}

TEST(SdcRerunVerdict, AnyDifferingHashDoesNotReproduceAndTheFirstOneIsNamed) {
  for (size_t at = 0; at < 4; ++at) {
    std::vector<uint64_t> first = {5, 6, 7, 8}, rerun = first;
    rerun[at] ^= 1;
    const RerunVerdict v = judge_rerun(first, rerun);
    EXPECT_FALSE(v.reproduced) << at;
    EXPECT_EQ(v.first_differing, static_cast<int>(at));
  }
  const RerunVerdict v = judge_rerun({5, 6, 7, 8}, {5, 9, 7, 9});
  EXPECT_EQ(v.first_differing, 1);
}

TEST(SdcRerunVerdict, ListsOfDifferentLengthsAreACallersMistake) {
  try {
    judge_rerun({1, 2}, {1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind, ErrorKind::Internal);
  }
}

TEST(SdcFaultSpec, SdcgradTakesARankAndAStepAndFiresInAttemptZeroOnly) {
  const std::vector<Fault> f = parse_faults("sdcgrad:rank=1:step=12");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, FaultKind::SdcGrad);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[0].step, 12);
  EXPECT_TRUE(f[0].fires_in(0));
  EXPECT_FALSE(f[0].fires_in(1));
  EXPECT_STREQ(fault_kind_name(f[0].kind), "sdcgrad");
  EXPECT_THROW(parse_faults("sdcgrad:step=12"), Error);
  EXPECT_THROW(parse_faults("sdcgrad:rank=1:step=0"), Error);
}
