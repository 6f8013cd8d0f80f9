// Rotary position embedding in place on the q and k heads of packed bf16 qkv rows (rotate_half pairing: element i
// of a head pairs with element i + hd/2; freq_i = rope_inv_freq (kernels/rope_freqs.h), the CPU reference's own
// function; position = t).
//
// One thread per (row, pair index i): it computes cos/sin of t * freq_i once and applies them to that pair in
// every q and k head of the row (heads are contiguous: [q heads | k heads | v heads]). The angle is formed in
// double, as the CPU reference's table is: t * freq reaches thousands of radians, where a float angle would carry
// errors of ~1e-4 rad; the double math is amortised over all heads of the row.
#include "megatrain/kernels/cuda/device_util.cuh"
#include "megatrain/kernels/rope_freqs.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(bf16* qkv, int64_t rows, int64_t T, int heads, int64_t width, int head_dim, RopeFreqs f,
                            float sign) {
  const int half = head_dim / 2;
  for (int64_t e = global_thread(); e < rows * half; e += grid_threads()) {
    const int64_t r = e / half;
    const int i = static_cast<int>(e % half);
    const int64_t t = r % T;
    const double inv_freq = rope_inv_freq(f, i, head_dim);
    double sd, cd;
    sincos(static_cast<double>(t) * inv_freq, &sd, &cd);
    const float c = static_cast<float>(cd), sn = sign * static_cast<float>(sd);
    bf16* row = qkv + r * width;
    for (int h = 0; h < heads; ++h) {
      bf16* x1 = row + h * head_dim + i;
      bf16* x2 = x1 + half;
      const float a = to_f(*x1), b = to_f(*x2);
      *x1 = from_f<bf16>(a * c - b * sn);
      *x2 = from_f<bf16>(a * sn + b * c);
    }
  }
}

}  // namespace

void rope(cudaStream_t s, bf16* qkv, int64_t B, int64_t T, int n_head, int n_kv_head, int head_dim, const RopeFreqs& f,
          float sign) {
  const int64_t rows = B * T, width = static_cast<int64_t>(n_head + 2 * n_kv_head) * head_dim;
  const int64_t work = rows * (head_dim / 2);
  if (work <= 0) return;
  rope_kernel<<<grid_for(work, kThreads), kThreads, 0, s>>>(qkv, rows, T, n_head + n_kv_head, width, head_dim, f, sign);
  check_launch("rope_kernel");
}

}  // namespace mt::cuda
