// An exact 64-bit hash of n 32-bit words (the bits of n floats), defined so that it can be computed in any order:
// on the CPU in one loop, on a GPU by thousands of threads where the tensor lives, with the same result bit for bit.
// The silent-data-corruption check (train/sdc_check.h) compares it across data-parallel replicas.
//
//   term(w, i)  = mix(w ^ (i * kIndexMul))                      (w zero-extended to 64 bits)
//   bits_hash   = mix(S ^ (n * kCountMul) ^ kSeed), S = sum of term(w_i, i) over i < n, modulo 2^64
//
// Invariants, and why they hold:
//  * one changed word always changes the hash: for a fixed i, term is a bijection of w (an xor with a constant,
//    then mix, a bijection of 64-bit words: splitmix64's finaliser, xor-shifts and odd multiplies), so the changed
//    word changes its own term and no other, and so S and, mix being a bijection, the hash;
//  * the order of the sum does not matter: addition modulo 2^64 is associative and commutative and exact, so a
//    GPU's tree of partial sums and a CPU's loop agree bit for bit;
//  * position and count count: the index in each term makes swapped words differ (almost always), and n in the
//    final mix makes a trailing zero word count.
// Not cryptographic: it guards against faults, not adversaries.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt {

constexpr uint64_t kBitsHashIndexMul = 0x9e3779b97f4a7c15ull;  // the golden ratio's 64-bit odd constant
constexpr uint64_t kBitsHashCountMul = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kBitsHashSeed = 0xcbf29ce484222325ull;

MT_HOST_DEVICE inline uint64_t bits_hash_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

MT_HOST_DEVICE inline uint64_t bits_hash_term(uint32_t w, uint64_t i) {
  return bits_hash_mix(uint64_t{w} ^ (i * kBitsHashIndexMul));
}

MT_HOST_DEVICE inline uint64_t bits_hash_finish(uint64_t sum, uint64_t n) {
  return bits_hash_mix(sum ^ (n * kBitsHashCountMul) ^ kBitsHashSeed);
}

// The hash of n 32-bit words at p (floats or int32s: their bits, NaN payloads and -0 included); the sum runs on
// the OpenMP threads (any split gives the same bits).
uint64_t bits_hash(const void* p, size_t n);

}  // namespace mt
