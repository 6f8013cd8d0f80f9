#include "megatrain/train/sdc_verdict.h"

#include <cstring>
#include <map>

#include "megatrain/core/bits_hash.h"
#include "megatrain/core/error.h"

namespace mt {

namespace {

constexpr uint64_t kFnvPrime = 0x100000001b3ull;  // FNV-1a's 64-bit prime (odd: multiplying by it is a bijection)

}  // namespace

uint64_t param_hash(const float* p, size_t n) { return bits_hash(p, n); }

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
