// RoPE's rotation frequencies, shared by the CPU reference and the CUDA kernel (host and device code).
//
// freq_i = theta^(-2i/head_dim) for pair i of a head. Llama 3.1 and later stretch the low frequencies for long
// contexts (HF rope_type "llama3"): with scaling > 0, a frequency whose wavelength 2 pi / freq is longer than
// original_len / low_freq_factor is divided by `scaling`; one shorter than original_len / high_freq_factor is kept;
// one in between is interpolated, (1 - s) freq / scaling + s freq with s = (original_len / wavelength - low) /
// (high - low). Computed in double: positions times frequencies reach thousands of radians.
#pragma once
#include <math.h>

#if defined(__CUDACC__)
#define MT_ROPE_HD __host__ __device__
#else
#define MT_ROPE_HD
#endif

namespace mt {

struct RopeFreqs {
  float theta = 10000.0f;
  float scaling = 0.0f;  // 0: no scaling
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
  int original_len = 8192;  // the context length the model was first trained at
};

MT_ROPE_HD inline double rope_inv_freq(const RopeFreqs& f, int i, int head_dim) {
  const double freq = exp(-2.0 * i / head_dim * log(static_cast<double>(f.theta)));
  if (f.scaling <= 0) return freq;
  const double two_pi = 6.283185307179586476925286766559;
  const double wavelength = two_pi / freq;
  if (wavelength < f.original_len / static_cast<double>(f.high_freq_factor)) return freq;
  if (wavelength > f.original_len / static_cast<double>(f.low_freq_factor)) return freq / f.scaling;
  const double s = (f.original_len / wavelength - f.low_freq_factor) /
                   (static_cast<double>(f.high_freq_factor) - f.low_freq_factor);
  return (1.0 - s) * freq / f.scaling + s * freq;
}

}  // namespace mt
