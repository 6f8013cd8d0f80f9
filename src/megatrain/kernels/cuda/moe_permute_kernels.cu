// The MoE permutation of token rows into expert order and its backward, on bf16 rows.
//
// Both are gathers: the forward reads token[r] for each permuted row r, the backward reads the token's own k slots
// (row[t, j]) for each token row t. The backward could instead scatter each permuted row into its token with
// atomics, but float atomics add in arrival order, so the bits would change from run to run; as a gather each token
// row has one writer, sums its slots in slot order in fp32, and rounds once. One block per row (grid-stride), each
// thread a fixed set of 16-byte packs of 8 columns (or single columns when C is not a multiple of 8 or a pointer is
// not 16-byte aligned); the indices are read once per row by every thread (they sit in L1).
#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 128;

template <int K>
__global__ void permute_kernel(bf16* xp, const bf16* x, const int32_t* token, int64_t A, int64_t C) {
  for (int64_t r = blockIdx.x; r < A; r += gridDim.x) {
    const bf16* src = x + static_cast<int64_t>(token[r]) * C;
    bf16* dst = xp + r * C;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * K; c < C; c += static_cast<int64_t>(blockDim.x) * K)
      store_pack<K>(dst + c, load_pack<K>(src + c));
  }
}

template <int K>
__global__ void permute_backward_kernel(bf16* dx, const bf16* dxp, const int32_t* row, int64_t N, int k, int64_t C) {
  for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
    const int32_t* rows = row + t * k;
    bf16* out = dx + t * C;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * K; c < C; c += static_cast<int64_t>(blockDim.x) * K) {
      Pack<K, bf16> o = load_pack<K>(out + c);
      float acc[K];
#pragma unroll
      for (int i = 0; i < K; ++i) acc[i] = to_f(o.v[i]);
      for (int j = 0; j < k; ++j) {
        const int32_t r = rows[j];
        if (r < 0) continue;  // dropped by the capacity: it reached no expert
        const Pack<K, bf16> g = load_pack<K>(dxp + static_cast<int64_t>(r) * C + c);
#pragma unroll
        for (int i = 0; i < K; ++i) acc[i] += to_f(g.v[i]);
      }
#pragma unroll
      for (int i = 0; i < K; ++i) o.v[i] = from_f<bf16>(acc[i]);
      store_pack<K>(out + c, o);
    }
  }
}

bool packs(int64_t C, const void* a, const void* b) { return C % kPack<bf16> == 0 && aligned16(a) && aligned16(b); }

}  // namespace

void moe_permute(cudaStream_t s, bf16* xp, const bf16* x, const int32_t* token, int64_t A, int64_t C) {
  if (A == 0 || C == 0) return;
  const unsigned grid = grid_for(A * kThreads, kThreads);  // one block per row, at most 65536 (grid-stride)
  if (packs(C, xp, x)) {
    permute_kernel<kPack<bf16>><<<grid, kThreads, 0, s>>>(xp, x, token, A, C);
  } else {
    permute_kernel<1><<<grid, kThreads, 0, s>>>(xp, x, token, A, C);
  }
  check_launch("moe_permute");
}

void moe_permute_backward(cudaStream_t s, bf16* dx, const bf16* dxp, const int32_t* row, int64_t N, int k, int64_t C) {
  if (N == 0 || C == 0) return;
  const unsigned grid = grid_for(N * kThreads, kThreads);
  if (packs(C, dx, dxp)) {
    permute_backward_kernel<kPack<bf16>><<<grid, kThreads, 0, s>>>(dx, dxp, row, N, k, C);
  } else {
    permute_backward_kernel<1><<<grid, kThreads, 0, s>>>(dx, dxp, row, N, k, C);
  }
  check_launch("moe_permute_backward");
}

}  // namespace mt::cuda
