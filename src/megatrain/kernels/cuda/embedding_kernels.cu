// Token (+ learned position) embedding, forward and backward.
// Layouts: tokens [N] (N = B*T; the position of token i is i % T), wte [rows, C], wpe [max_T, C], out [N, C].
#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per pack of K channels of one output row (C % K == 0 when K > 1). A token < 0 (owned by another
// vocabulary shard) gives wpe[t] alone, or zeros; a token >= rows is reported through `err` and gives zeros.
template <int K>
__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte, int64_t rows,
                                         const bf16* wpe, int64_t N, int64_t T, int64_t C, int* err) {
  const int64_t npack = N * C / K;
  for (int64_t p = global_thread(); p < npack; p += grid_threads()) {
    const int64_t e = p * K, i = e / C, c = e % C;
    const int32_t tok = tokens[i];
    float acc[K];
#pragma unroll
    for (int k = 0; k < K; ++k) acc[k] = 0.0f;
    if (tok >= rows) {
      if (c == 0) atomicOr(err, kErrToken);
    } else if (tok >= 0) {
      const Pack<K, bf16> x = load_pack<K>(wte + tok * C + c);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] = to_f(x.v[k]);
    }
    if (wpe) {
      const Pack<K, bf16> x = load_pack<K>(wpe + (i % T) * C + c);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += to_f(x.v[k]);
    }
    Pack<K, bf16> o;
#pragma unroll
    for (int k = 0; k < K; ++k) o.v[k] = from_f<bf16>(acc[k]);
    store_pack<K>(out + e, o);
  }
}

// dwte[tokens[i], c] += dout[i, c]. Tokens repeat, so rows collide: fp32 atomics (the order of the adds, hence the
// last bits, varies between runs; a sort by token would make it deterministic at the cost of a sort per step).
__global__ void embedding_backward_wte_kernel(float* dwte, int64_t rows, const bf16* dout, const int32_t* tokens,
                                              int64_t N, int64_t C, int* err) {
  for (int64_t e = global_thread(); e < N * C; e += grid_threads()) {
    const int64_t i = e / C, c = e % C;
    const int32_t tok = tokens[i];
    if (tok >= rows) {
      if (c == 0) atomicOr(err, kErrToken);
    } else if (tok >= 0) {
      atomicAdd(dwte + tok * C + c, to_f(dout[e]));
    }
  }
}

// dwpe[t, c] += sum over b of dout[b*T + t, c]: one thread per (t, c) adds the batch in order (deterministic, no
// atomics: positions never collide within a thread's sum).
__global__ void embedding_backward_wpe_kernel(float* dwpe, const bf16* dout, int64_t N, int64_t T, int64_t C) {
  const int64_t B = N / T;
  for (int64_t e = global_thread(); e < T * C; e += grid_threads()) {
    float acc = 0;
    for (int64_t b = 0; b < B; ++b) acc += to_f(dout[b * T * C + e]);
    dwpe[e] += acc;
  }
}

}  // namespace

void embedding_forward(cudaStream_t s, bf16* out, const int32_t* tokens, const bf16* wte, int64_t rows, const bf16* wpe,
                       int64_t N, int64_t T, int64_t C, int* err) {
  if (N * C <= 0) return;
  if (C % 8 == 0 && aligned16(out) && aligned16(wte) && (wpe == nullptr || aligned16(wpe)))
    embedding_forward_kernel<8>
        <<<grid_for(N * C / 8, kThreads), kThreads, 0, s>>>(out, tokens, wte, rows, wpe, N, T, C, err);
  else
    embedding_forward_kernel<1>
        <<<grid_for(N * C, kThreads), kThreads, 0, s>>>(out, tokens, wte, rows, wpe, N, T, C, err);
  check_launch("embedding_forward_kernel");
}

void embedding_backward(cudaStream_t s, float* dwte, int64_t rows, float* dwpe, const bf16* dout, const int32_t* tokens,
                        int64_t N, int64_t T, int64_t C, int* err) {
  if (N * C <= 0) return;
  embedding_backward_wte_kernel<<<grid_for(N * C, kThreads), kThreads, 0, s>>>(dwte, rows, dout, tokens, N, C, err);
  check_launch("embedding_backward_wte_kernel");
  if (dwpe) {
    embedding_backward_wpe_kernel<<<grid_for(T * C, kThreads), kThreads, 0, s>>>(dwpe, dout, N, T, C);
    check_launch("embedding_backward_wpe_kernel");
  }
}

}  // namespace mt::cuda
