// Deterministic random numbers: a counter-free xoshiro256** generator whose whole state is four words, so
// it can be saved in a checkpoint and restored bit-exactly.
#pragma once
#include <array>
#include <cstdint>

namespace mt {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next_u64();
  uint32_t next_u32() { return static_cast<uint32_t>(next_u64() >> 32); }
  float uniform();             // [0, 1)
  float normal();              // standard normal (Box-Muller, no cached second value: state is just s_)
  uint64_t below(uint64_t n);  // uniform integer in [0, n)
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

// Mixes integers into one well-spread 64-bit seed (e.g. seed, epoch, rank).
uint64_t mix_seed(uint64_t a, uint64_t b = 0, uint64_t c = 0);

}  // namespace mt
