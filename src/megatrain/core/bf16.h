// bfloat16 on the host: the top 16 bits of an IEEE float. Conversions round to nearest even, as the GPU's
// __float2bfloat16 does, so host-side references and checkpoints agree bit for bit with device results.
#pragma once
#include <cstdint>
#include <cstring>

namespace mt {

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f rounded to the nearest bf16 value, as a float.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace mt
