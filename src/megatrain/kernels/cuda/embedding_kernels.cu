// Token (+ learned position) embedding, forward and backward.
// Layouts: tokens [N] (N = B*T; the position of token i is i % T), wte [rows, C], wpe [max_T, C], out [N, C].
//
// The token table's gradient has two paths. The default adds every row of dout into its token's row with fp32
// atomics: fast, but a token that repeats gets its rows added in whatever order the threads reach the memory, so the
// last bits vary from run to run. The deterministic path (train.deterministic) sorts the (token, row) pairs by token
// with CUB's stable radix sort, so each token's rows form one run listed in increasing row order, and one thread per
// (run, channel) adds its run in that order and then adds the sum into dwte once: the same adds in the same order
// every run, no atomics. It costs the sort (a few passes over 2N ints) and serialises a run: a token repeated R
// times is R dependent adds per channel.
#include <cub/device/device_radix_sort.cuh>

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

// The sort's input: key = the token, or `rows` for a token that has no row here (< 0: another vocabulary shard's;
// >= rows: an error, reported through err), so such rows sort last and are skipped; value = the row index.
__global__ void embedding_sort_input_kernel(uint32_t* keys, int32_t* idx, const int32_t* tokens, int64_t N,
                                            int64_t rows, int* err) {
  for (int64_t i = global_thread(); i < N; i += grid_threads()) {
    const int32_t tok = tokens[i];
    if (tok >= rows) atomicOr(err, kErrToken);
    keys[i] = (tok < 0 || tok >= rows) ? static_cast<uint32_t>(rows) : static_cast<uint32_t>(tok);
    idx[i] = static_cast<int32_t>(i);
  }
}

// One thread per (sorted position j, channel c); only the first position of each token's run works: it adds
// dout[idx[j'], c] for j' along the run in sorted order (rows increasing: the sort is stable), then dwte once.
// Consecutive threads are consecutive channels, so the reads of one row are coalesced.
__global__ void embedding_backward_wte_sorted_kernel(float* dwte, int64_t rows, const bf16* dout, const uint32_t* keys,
                                                     const int32_t* idx, int64_t N, int64_t C) {
  for (int64_t e = global_thread(); e < N * C; e += grid_threads()) {
    const int64_t j = e / C, c = e % C;
    const uint32_t tok = keys[j];
    if (tok >= static_cast<uint64_t>(rows) || (j > 0 && keys[j - 1] == tok)) continue;
    float acc = 0.0f;
    for (int64_t k = j; k < N && keys[k] == tok; ++k) acc += to_f(dout[static_cast<int64_t>(idx[k]) * C + c]);
    dwte[static_cast<int64_t>(tok) * C + c] += acc;
  }
}

// The number of low key bits the sort must look at: keys are in [0, rows].
int key_bits(int64_t rows) {
  int b = 1;
  while (b < 32 && (int64_t{1} << b) <= rows) ++b;
  return b;
}

// The layout of the deterministic path's workspace: keys and values in and out, then CUB's temporary storage.
struct SortLayout {
  size_t keys_in = 0, keys_out, idx_in, idx_out, cub, cub_bytes, total;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

SortLayout sort_layout(int64_t N, int64_t rows) {
  SortLayout l;
  const size_t n4 = align256(static_cast<size_t>(N) * 4);
  l.keys_out = l.keys_in + n4;
  l.idx_in = l.keys_out + n4;
  l.idx_out = l.idx_in + n4;
  l.cub = l.idx_out + n4;
  l.cub_bytes = 0;
  // With null storage CUB only reports the bytes it needs (nothing is launched).
  cub::DeviceRadixSort::SortPairs(nullptr, l.cub_bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(N), 0, key_bits(rows));
  l.total = l.cub + align256(l.cub_bytes);
  return l;
}

}  // namespace

size_t embedding_sorted_workspace_bytes(int64_t N, int64_t rows) { return N > 0 ? sort_layout(N, rows).total : 0; }

void embedding_backward_sorted(cudaStream_t s, float* dwte, int64_t rows, float* dwpe, const bf16* dout,
                               const int32_t* tokens, int64_t N, int64_t T, int64_t C, int* err, void* workspace) {
  if (N * C <= 0) return;
  const SortLayout l = sort_layout(N, rows);
  char* ws = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(ws + l.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + l.keys_out);
  auto* idx_in = reinterpret_cast<int32_t*>(ws + l.idx_in);
  auto* idx_out = reinterpret_cast<int32_t*>(ws + l.idx_out);
  embedding_sort_input_kernel<<<grid_for(N, kThreads), kThreads, 0, s>>>(keys_in, idx_in, tokens, N, rows, err);
  check_launch("embedding_sort_input_kernel");
  size_t cub_bytes = l.cub_bytes;
  check(cub::DeviceRadixSort::SortPairs(ws + l.cub, cub_bytes, keys_in, keys_out, idx_in, idx_out, static_cast<int>(N),
                                        0, key_bits(rows), s),
        "cub::DeviceRadixSort::SortPairs (embedding backward)");
  embedding_backward_wte_sorted_kernel<<<grid_for(N * C, kThreads), kThreads, 0, s>>>(dwte, rows, dout, keys_out,
                                                                                      idx_out, N, C);
  check_launch("embedding_backward_wte_sorted_kernel");
  if (dwpe) {
    embedding_backward_wpe_kernel<<<grid_for(T * C, kThreads), kThreads, 0, s>>>(dwpe, dout, N, T, C);
    check_launch("embedding_backward_wpe_kernel");
  }
}

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
