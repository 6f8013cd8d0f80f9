#include "megatrain/train/sdc_verdict.h"

#include <cstring>
#include <map>

#include "megatrain/core/error.h"

namespace mt {

namespace {

constexpr uint64_t kFnvPrime = 0x100000001b3ull;  // FNV-1a's 64-bit prime (odd: multiplying by it is a bijection)

// splitmix64's finaliser: every output bit depends on every input bit (a bijection too).
uint64_t sdc_avalanche(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t param_hash(const float* p, size_t n) {
  // Four lanes: word i goes to lane i % 4, so the multiplies of neighbouring words do not wait on each other.
  uint64_t lane[4] = {kHashSeed, kHashSeed ^ 1, kHashSeed ^ 2, kHashSeed ^ 3};
  const size_t body = n & ~size_t(3);
  for (size_t i = 0; i < body; i += 4) {
    uint32_t w[4];
    std::memcpy(w, p + i, sizeof w);  // the float's bits, whatever their value (NaN payloads, -0 included)
    for (int k = 0; k < 4; ++k) lane[k] = (lane[k] ^ w[k]) * kFnvPrime;
  }
  for (size_t i = body; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, p + i, sizeof w);
    lane[i % 4] = (lane[i % 4] ^ w) * kFnvPrime;
  }
  uint64_t h = kHashSeed ^ n;
  for (uint64_t l : lane) h = combine_hash(h, l);
  return sdc_avalanche(h);
}

uint64_t combine_hash(uint64_t acc, uint64_t h) {
  // The low and high halves in turn, FNV-1a style: a bijection of h for a given acc.
  acc = (acc ^ (h & 0xffffffffull)) * kFnvPrime;
  acc = (acc ^ (h >> 32)) * kFnvPrime;
  return acc;
}

ReplicaVerdict judge_replicas(const std::vector<uint64_t>& hashes) {
  ReplicaVerdict v;
  std::map<uint64_t, int> count;
  for (uint64_t h : hashes) ++count[h];
  if (count.size() <= 1) {
    v.majority = hashes.empty() ? 0 : hashes[0];
    return v;
  }
  v.agree = false;
  int best = 0, holders_of_best = 0;
  for (const auto& [h, c] : count) {
    if (c > best) {
      best = c;
      holders_of_best = 1;
      v.majority = h;
    } else if (c == best) {
      ++holders_of_best;
    }
  }
  v.no_majority = best < 2 || holders_of_best > 1;
  for (size_t i = 0; i < hashes.size(); ++i)
    if (v.no_majority || hashes[i] != v.majority) v.odd.push_back(static_cast<int>(i));
  if (v.no_majority) v.majority = 0;
  return v;
}

RerunVerdict judge_rerun(const std::vector<uint64_t>& first, const std::vector<uint64_t>& rerun) {
  MT_CHECK(first.size() == rerun.size(), "judge_rerun: {} hashes of the first pass against {} of the rerun",
           first.size(), rerun.size());
  RerunVerdict v;
  for (size_t i = 0; i < first.size(); ++i)
    if (first[i] != rerun[i]) {
      v.reproduced = false;
      v.first_differing = static_cast<int>(i);
      break;
    }
  return v;
}

}  // namespace mt
