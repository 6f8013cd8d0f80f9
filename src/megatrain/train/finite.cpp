#include "megatrain/train/finite.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace mt {

int64_t first_non_finite(const float* x, int64_t n) {
  // Blocks scanned with a branch-free test of the exponent bits (all ones: inf or NaN), which vectorises; only a
  // block that has one is searched again for its position. A checkpoint is scanned once, at memory speed.
  constexpr int64_t kBlock = 1 << 14;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    uint32_t any = 0;
    for (int64_t i = b; i < e; ++i) any |= (std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u;
    if (!any) continue;
    for (int64_t i = b; i < e; ++i)
      if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

}  // namespace mt
