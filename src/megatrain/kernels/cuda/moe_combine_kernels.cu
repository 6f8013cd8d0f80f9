// The MoE combine (each token's gated sum of its expert outputs) and its backward, on bf16 rows with fp32 gates.
//
// One block per token (grid-stride), each thread a fixed set of 16-byte packs of 8 columns (single columns when C is
// not a multiple of 8 or a pointer is not 16-byte aligned). The forward gathers the token's kept slots in slot order
// and sums in fp32, rounding once. The backward writes each kept slot's permuted row (gate * dy, one rounding) and
// the gate's gradient dot(dy, yp[row]): each thread sums its own columns in order, then block_sum adds the threads'
// sums in a fixed tree, so the dot is the same bits on every run (no atomics anywhere).
#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 128;

template <int K>
__global__ void combine_kernel(bf16* y, const bf16* yp, const int32_t* row, const float* gate, int64_t N, int k,
                               int64_t C) {
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * K; c < C; c += static_cast<int64_t>(blockDim.x) * K) {
      float acc[K] = {};
      for (int j = 0; j < k; ++j) {
        const int32_t r = row[t * k + j];
        if (r < 0) continue;  // dropped by the capacity: adds nothing
        const float g = gate[t * k + j];
        const Pack<K, bf16> v = load_pack<K>(yp + static_cast<int64_t>(r) * C + c);
#pragma unroll
        for (int i = 0; i < K; ++i) acc[i] += g * to_f(v.v[i]);
      }
      Pack<K, bf16> o;
#pragma unroll
      for (int i = 0; i < K; ++i) o.v[i] = from_f<bf16>(acc[i]);
      store_pack<K>(y + t * C + c, o);
    }
  }
}

template <int K>
__global__ void combine_backward_kernel(bf16* dyp, float* dgate, const bf16* dy, const bf16* yp, const int32_t* row,
                                        const float* gate, int64_t N, int k, int64_t C) {
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    for (int j = 0; j < k; ++j) {
      const int32_t r = row[t * k + j];  // the same for the whole block, so block_sum below is reached by all
      if (r < 0) {
        if (threadIdx.x == 0) dgate[t * k + j] = 0.0f;
        continue;
      }
      const float g = gate[t * k + j];
      float dot = 0;
      for (int64_t c = static_cast<int64_t>(threadIdx.x) * K; c < C; c += static_cast<int64_t>(blockDim.x) * K) {
        const Pack<K, bf16> d = load_pack<K>(dy + t * C + c);
        const Pack<K, bf16> v = load_pack<K>(yp + static_cast<int64_t>(r) * C + c);
        Pack<K, bf16> o;
#pragma unroll
        for (int i = 0; i < K; ++i) {
          o.v[i] = from_f<bf16>(g * to_f(d.v[i]));
          dot += to_f(d.v[i]) * to_f(v.v[i]);
        }
        store_pack<K>(dyp + static_cast<int64_t>(r) * C + c, o);
      }
      dot = block_sum(dot);
      if (threadIdx.x == 0) dgate[t * k + j] = dot;
    }
  }
}

bool packs(int64_t C, const void* a, const void* b, const void* c) {
  return C % kPack<bf16> == 0 && aligned16(a) && aligned16(b) && (!c || aligned16(c));
}

}  // namespace

void moe_combine(cudaStream_t s, bf16* y, const bf16* yp, const int32_t* row, const float* gate, int64_t N, int k,
                 int64_t C) {
  if (N == 0 || C == 0) return;
  const unsigned grid = grid_for(N * kThreads, kThreads);  // one block per token, at most 65536 (grid-stride)
  if (packs(C, y, yp, nullptr)) {
    combine_kernel<kPack<bf16>><<<grid, kThreads, 0, s>>>(y, yp, row, gate, N, k, C);
  } else {
    combine_kernel<1><<<grid, kThreads, 0, s>>>(y, yp, row, gate, N, k, C);
  }
  check_launch("moe_combine");
}

void moe_combine_backward(cudaStream_t s, bf16* dyp, float* dgate, const bf16* dy, const bf16* yp, const int32_t* row,
                          const float* gate, int64_t N, int k, int64_t C) {
  if (N == 0) return;
  const unsigned grid = grid_for(N * kThreads, kThreads);
  if (packs(C, dyp, dy, yp)) {
    combine_backward_kernel<kPack<bf16>><<<grid, kThreads, 0, s>>>(dyp, dgate, dy, yp, row, gate, N, k, C);
  } else {
    combine_backward_kernel<1><<<grid, kThreads, 0, s>>>(dyp, dgate, dy, yp, row, gate, N, k, C);
  }
  check_launch("moe_combine_backward");
}

}  // namespace mt::cuda
