// The pure half of the silent-data-corruption checks (train/sdc_check.h, train/sdc_rerun.h): an exact hash of
// parameters (or gradients), the decision which data-parallel replica is odd, given every replica's hash, and
// whether a rank's rerun of a step reproduced its gradients. Nothing here communicates.
//
// Invariants:
//  * param_hash (core/bits_hash.h) is a function of the bits of the floats, their positions and their count only:
//    two replicas holding the same parameters bit for bit hash alike on any machine and backend (a GPU hashes
//    where the tensor lives, Ops::bits_hash, with the CPU loop's result), and a change of any one 32-bit word (one
//    bit of one weight) always changes the hash, so a single flipped bit is never missed;
//  * judge_replicas names odd replicas only against a majority: the hash that the most replicas hold, when that
//    count is unique and at least 2 (dp = 3: 2 against 1; dp = 4: 3 against 1, or 2 against 1 + 1). Without one
//    (dp = 2 disagreeing; 1 + 1 + 1; 2 + 2) every replica is a suspect and no_majority is set: finding which side
//    is wrong then needs a rerun, not a vote.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mt {

// A 64-bit hash of n floats' bits: core/bits_hash.h's (a sum of one mixed term per word and position, then the count
// and a final mix). Not cryptographic: it guards against faults, not adversaries.
uint64_t param_hash(const float* p, size_t n);
// Folds a tensor's hash into a running hash of several (order matters): the hash of a whole replica's tensors.
uint64_t combine_hash(uint64_t acc, uint64_t h);
constexpr uint64_t kHashSeed = 0xcbf29ce484222325ull;  // FNV-1a's offset basis: the running hash's start

struct ReplicaVerdict {
  bool agree = true;         // every replica holds the same hash
  bool no_majority = false;  // they disagree and no majority exists: every replica is a suspect
  uint64_t majority = 0;     // the majority's hash (meaningful when agree or a majority exists)
  std::vector<int> odd;      // the replicas (indices into the hashes) outside the majority, or all of them
};

// hashes[i]: replica i's hash (i: its rank in the dp group).
ReplicaVerdict judge_replicas(const std::vector<uint64_t>& hashes);

// A rank's rerun of a step (train/sdc_rerun.h): its gradients' hashes, tensor by tensor, after the step's first pass
// and after the rerun. Reproduced only when every hash is equal (the rerun is the same computation on the same
// data: any difference is the hardware's); else the first tensor that differs names where. Lists of different
// lengths (a caller's mistake) are an Internal error.
struct RerunVerdict {
  bool reproduced = true;
  int first_differing = -1;  // index into the lists; -1 when reproduced
};
RerunVerdict judge_rerun(const std::vector<uint64_t>& first, const std::vector<uint64_t>& rerun);

}  // namespace mt
