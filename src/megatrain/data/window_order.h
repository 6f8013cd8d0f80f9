// WindowOrder: the order in which an epoch visits the dataset's windows, as a function of position.
//
// A shuffled epoch must visit each of the W windows exactly once in an order that depends only on (seed, epoch).
// Materialising that order (an array of W indices shuffled by Fisher-Yates) costs every rank 8 bytes per window and
// a pass of W random swaps each epoch and at every restart: 3.9 GB and seconds per rank for a trillion tokens at
// T = 2048, times the ranks on a node, all holding the same array. Instead, position i maps to window order(i)
// through a keyed pseudo-random permutation computed on demand: O(1) memory, a few ns per row, and every rank, on
// any node, computes the same order with nothing shared. This is the part of MegaScale's "redundant data loader
// elimination" that matters once the data is pre-tokenized: the token bytes themselves are read with pread through
// the page cache (data/shard.h), so a node's ranks already share one copy of them there.
//
// The permutation: a balanced Feistel network on 2k-bit integers (2^2k the smallest power of four >= W, so at most
// 4W), six rounds whose round function is a 64-bit mixer of (half, round key), restricted to [0, W) by cycle
// walking (apply it again until the value lands below W). A Feistel network is a bijection on its domain whatever
// the round function, and cycle walking keeps a bijection of the domain a bijection of [0, W); it takes fewer than
// four applications on average (the domain holds at most 4W values).
#pragma once
#include <cstdint>

namespace mt {

class WindowOrder {
 public:
  // A permutation of [0, n) keyed by (seed, epoch); n = 0 is allowed (nothing to visit).
  WindowOrder(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t operator()(uint64_t i) const;  // the window visited at position i; i < n (unchecked)
  uint64_t size() const { return n_; }

  static constexpr int kRounds = 6;
  static constexpr const char* kName = "feistel6";  // recorded in checkpoints: the order a data position refers to

 private:
  uint64_t permute_domain(uint64_t x) const;  // one pass of the Feistel network over [0, 2^(2 half_bits_))
  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[kRounds];
};

}  // namespace mt
