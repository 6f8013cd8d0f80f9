#include "megatrain/data/window_order.h"

#include "megatrain/core/rng.h"

namespace mt {
namespace {

// The round function: a 64-bit finaliser (murmur3's constants) of the half and the round key. Any function makes
// the network a bijection; a well-mixing one makes the order look random.
uint64_t round_fn(uint64_t half, uint64_t key) {
  uint64_t z = half ^ key;
  z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
  z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return z ^ (z >> 33);
}

}  // namespace

WindowOrder::WindowOrder(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  int bits = 0;  // ceil(log2(n)), at least 2 so each half has a bit
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  if (bits < 2) bits = 2;
  half_bits_ = (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  Rng rng(mix_seed(seed, epoch, 0x57696e646f77ULL));  // a stream of its own: "Window"
  for (uint64_t& k : keys_) k = rng.next_u64();
}

uint64_t WindowOrder::permute_domain(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ (round_fn(right, k) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t WindowOrder::operator()(uint64_t i) const {
  uint64_t x = permute_domain(i);
  while (x >= n_) x = permute_domain(x);
  return x;
}

}  // namespace mt
