// Rotary position embedding on the q and k heads of packed qkv rows (rotate_half pairing (i, i + hd/2); the
// frequencies of kernels/rope_freqs.h).
#include <cmath>
#include <vector>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

// cos/sin of t * freq_i (rope_inv_freq) for t < T, i < hd/2, computed in double once per (T, hd, frequencies) and
// cached per calling thread: every layer of a step asks for the same table.
struct RopeTable {
  int T = 0, hd = 0;
  RopeFreqs f{0.0f};
  std::vector<float> cos, sin;  // [T, hd/2]
};

bool same_freqs(const RopeFreqs& a, const RopeFreqs& b) {
  return a.theta == b.theta && a.scaling == b.scaling && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor && a.original_len == b.original_len;
}

const RopeTable& rope_table(int T, int hd, const RopeFreqs& f) {
  thread_local RopeTable tab;
  if (tab.T != T || tab.hd != hd || !same_freqs(tab.f, f)) {
    const int half = hd / 2;
    tab.cos.resize(static_cast<size_t>(T) * half);
    tab.sin.resize(static_cast<size_t>(T) * half);
    for (int i = 0; i < half; ++i) {
      const double inv_freq = rope_inv_freq(f, i, hd);
      for (int t = 0; t < T; ++t) {
        const double ang = t * inv_freq;
        tab.cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(ang));
        tab.sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(ang));
      }
    }
    tab.T = T, tab.hd = hd, tab.f = f;
  }
  return tab;
}

// Rotates every (x_i, x_{i+hd/2}) pair by +angle (forward) or -angle (backward: the transpose of a rotation).
void rotate(const char* op, Tensor qkv, const AttnShape& s, const RopeFreqs& f, float sign) {
  float* x = f32_arg(qkv, op, "qkv");
  check_rope(op, qkv, s, f);
  const int64_t W = s.qkv_width();
  const int half = s.head_dim / 2, heads = s.n_head + s.n_kv_head;  // q heads then k heads, contiguous
  const RopeTable& tab = rope_table(s.T, s.head_dim, f);
  const float* ct = tab.cos.data();
  const float* st = tab.sin.data();
  const int64_t rows = int64_t{s.B} * s.T;
#pragma omp parallel for if (rows * heads * s.head_dim > kParallelMin) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % s.T;
    const float* c = ct + t * half;
    const float* sn = st + t * half;
    for (int h = 0; h < heads; ++h) {
      float* x1 = x + r * W + h * s.head_dim;
      float* x2 = x1 + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i], si = sign * sn[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = a * si + b * c[i];
      }
    }
  }
}

}  // namespace

void CpuOps::rope_forward(Tensor qkv, const AttnShape& s, const RopeFreqs& f) {
  rotate("rope_forward", qkv, s, f, 1.0f);
}

void CpuOps::rope_backward(Tensor dqkv, const AttnShape& s, const RopeFreqs& f) {
  rotate("rope_backward", dqkv, s, f, -1.0f);
}

}  // namespace mt
