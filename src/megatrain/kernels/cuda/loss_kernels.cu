// Fused softmax + cross-entropy over bf16 logits [N, Vp], and the three steps of its vocab-parallel variant.
//
// One block per row. Each thread walks its strided share of the row in 16-byte packs keeping an online
// (max, sum of exp(x - max)) pair in fp32 - rescaling the sum when the max grows - so the row is read once for the
// statistics; the pairs are then merged across the block. With write_grad the row is read a second time (mostly
// from L2: a 50k-entry bf16 row is 100 KB) and overwritten in place with (softmax - onehot) * dloss, so no
// probability tensor ever exists. An element is read and rewritten by the same thread in both passes; the one
// element read by another thread (the target logit, by thread 0) is read before the block reduction, whose
// barriers order it before any rewrite.
#include <map>
#include <mutex>
#include <utility>

#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 512;

struct MaxSum {
  float m, s;  // running max and sum of exp(x - m)
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty (avoids exp(-inf - -inf) = NaN)
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ void push(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += expf(x - a.m);
  }
}

__device__ MaxSum block_maxsum(MaxSum x) {
  __shared__ MaxSum part[32];
  __shared__ MaxSum total;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = (blockDim.x + kWarp - 1) / kWarp;
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const MaxSum y{__shfl_xor_sync(0xffffffffu, x.m, o), __shfl_xor_sync(0xffffffffu, x.s, o)};
    x = merge(x, y);
  }
  if (lane == 0) part[warp] = x;
  __syncthreads();
  if (warp == 0) {
    MaxSum y = lane < nwarps ? part[lane] : MaxSum{-INFINITY, 0.0f};
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const MaxSum z{__shfl_xor_sync(0xffffffffu, y.m, o), __shfl_xor_sync(0xffffffffu, y.s, o)};
      y = merge(y, z);
    }
    if (lane == 0) total = y;
  }
  __syncthreads();
  return total;
}

// Zeroes row[0, W) (ignored rows when writing gradients).
template <int K>
__device__ void zero_row(bf16* row, int64_t W) {
  Pack<K, bf16> z;
#pragma unroll
  for (int k = 0; k < K; ++k) z.v[k] = __float2bfloat16_rn(0.0f);
  for (int64_t c = threadIdx.x * K; c < W; c += blockDim.x * K) store_pack<K>(row + c, z);
}

// Writes row[0, W) as the softmax gradient of the logits x = src[0, W) (src is row itself, or its copy in shared
// memory): columns j < n_real get exp(x - lse) * dloss, minus dloss at column `hot` (none when hot < 0); the padded
// columns j >= n_real get 0. Each thread reads only the packs it writes.
template <int K>
__device__ void write_grad_row(bf16* row, const bf16* src, int64_t W, int64_t n_real, float lse, int64_t hot,
                               float dloss) {
#pragma unroll 4
  for (int64_t c = threadIdx.x * K; c < W; c += blockDim.x * K) {
    Pack<K, bf16> v = load_pack<K>(src + c);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = c + k;
      float g = 0.0f;
      if (j < n_real) g = expf(to_f(v.v[k]) - lse) * dloss - (j == hot ? dloss : 0.0f);
      v.v[k] = from_f<bf16>(g);
    }
    store_pack<K>(row + c, v);
  }
}

// Row n's target t before its loss: a target past the vocabulary is reported (kErrCeTarget) with a NaN loss; a
// negative one is an ignored position, loss 0 and gradient 0. False when that finished the row. t is uniform over
// the block, so the callers' early returns keep their barriers uniform.
template <int K>
__device__ bool ce_row_has_loss(float* losses, bf16* row, int32_t t, int64_t n, int64_t Vp, int64_t V, bool write_grad,
                                int* err) {
  if (t >= V) {
    if (threadIdx.x == 0) {
      atomicOr(err, kErrCeTarget);
      losses[n] = NAN;
    }
    return false;
  }
  if (t < 0) {
    if (threadIdx.x == 0) losses[n] = 0.0f;
    if (write_grad) zero_row<K>(row, Vp);
    return false;
  }
  return true;
}

// The end of a row, from its threads' (max, sum) pairs: the loss lse - z_t (zt: thread 0's copy of the target's
// logit), and with write_grad the gradient, from the logits at src.
template <int K>
__device__ void ce_finish_row(MaxSum ms, float zt, float* losses, int64_t n, bf16* row, const bf16* src, int64_t Vp,
                              int64_t V, int32_t t, float dloss, bool write_grad) {
  ms = block_maxsum(ms);
  const float lse = ms.m + logf(ms.s);
  if (threadIdx.x == 0) losses[n] = lse - zt;
  if (write_grad) write_grad_row<K>(row, src, Vp, V, lse, t, dloss);
}

// One block per row: the row's (max, sum of exp) in one pass, then its loss and, with write_grad, its gradient over
// the logits. kSmemRow keeps the row in shared memory between the two passes, so the gradient pass reads it from
// there, not from global memory again. Why: at GPT-2's vocabulary a row is 100 KB, and the rows of all resident
// blocks (~50 MB on an H100) outgrow the L2, so without it the second pass most likely goes back to DRAM (the
// kernel ran at 63% of copy bandwidth in bench_cuda_ops, and took 2.2 ms of the 124M model's 31.8 ms step). Each
// thread reads back only the packs it stored, and the sums are taken in the same order either way: the results are
// bit-identical. Loads are unrolled by 4 so each thread has several in flight (two 100 KB rows fit an SM's shared
// memory: 1024 threads). Rows wider than the shared memory a block may have (Llama 3's 128,256 columns) stream.
template <int K, bool kSmemRow>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(float* losses, bf16* logits, const int32_t* targets, int64_t Vp, int64_t V, float dloss,
                         bool write_grad, int* err) {
  extern __shared__ __align__(16) unsigned char ce_smem[];
  bf16* srow = reinterpret_cast<bf16*>(ce_smem);
  const int64_t n = blockIdx.x;
  bf16* row = logits + n * Vp;
  const int32_t t = targets[n];
  if (!ce_row_has_loss<K>(losses, row, t, n, Vp, V, write_grad, err)) return;
  const float zt = threadIdx.x == 0 ? to_f(row[t]) : 0.0f;  // read before the row is overwritten
  MaxSum ms{-INFINITY, 0.0f};
  const int64_t end = kSmemRow ? Vp : V;  // the shared copy holds the padding too, which the gradient pass zeroes
#pragma unroll 4
  for (int64_t c = threadIdx.x * K; c < end; c += blockDim.x * K) {
    const Pack<K, bf16> v = load_pack<K>(row + c);
    if constexpr (kSmemRow) store_pack<K>(srow + c, v);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (c + k < V) push(ms, to_f(v.v[k]));
  }
  ce_finish_row<K>(ms, zt, losses, n, row, kSmemRow ? srow : row, Vp, V, t, dloss, write_grad);
}

// Whether a row of Vp bf16 values fits the shared memory a block may opt in to on this device (and opts in). The
// limit and the largest size opted in so far are kept per device: the attribute calls are not repeated each step.
bool ce_row_fits_smem(int64_t Vp) {
  const size_t bytes = static_cast<size_t>(Vp) * sizeof(bf16);
  if (bytes <= 48 * 1024) return true;
  static std::mutex mu;
  static std::map<int, std::pair<size_t, size_t>> devices;  // device -> (opt-in limit, bytes opted in)
  int dev = 0;
  check(cudaGetDevice(&dev), "cross_entropy: cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto it = devices.find(dev);
  if (it == devices.end()) {
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
          "cross_entropy: cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    it = devices.emplace(dev, std::pair{static_cast<size_t>(optin), size_t{48 * 1024}}).first;
  }
  auto& [limit, opted] = it->second;
  // The opt-in limit covers the block's static shared memory too (block_maxsum's 272 bytes): keep 1 KB for it.
  if (bytes + 1024 > limit) return false;
  if (bytes > opted) {
    check(cudaFuncSetAttribute(cross_entropy_kernel<8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)),
          "cross_entropy: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    opted = bytes;
  }
  return true;
}

template <int K>
__global__ void vp_ce_max_kernel(float* stats, const bf16* logits, int64_t Vl, int64_t n_real) {
  const int64_t n = blockIdx.x;
  const bf16* row = logits + n * Vl;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x * K; c < n_real; c += blockDim.x * K) {
    const Pack<K, bf16> v = load_pack<K>(row + c);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (c + k < n_real) m = fmaxf(m, to_f(v.v[k]));
  }
  m = block_max(m);
  if (threadIdx.x == 0) stats[n] = m;
}

template <int K>
__global__ void vp_ce_sums_kernel(float* stats, const bf16* logits, const int32_t* targets, int64_t N, int64_t Vl,
                                  int64_t v0, int64_t n_real, int64_t V, int* err) {
  const int64_t n = blockIdx.x;
  const bf16* row = logits + n * Vl;
  const float m = stats[n];
  float s = 0;
  for (int64_t c = threadIdx.x * K; c < n_real; c += blockDim.x * K) {
    const Pack<K, bf16> v = load_pack<K>(row + c);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (c + k < n_real) s += expf(to_f(v.v[k]) - m);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    if (t >= V) atomicOr(err, kErrVpTarget);
    const int64_t local = static_cast<int64_t>(t) - v0;
    stats[N + n] = s;
    stats[2 * N + n] = t >= 0 && local >= 0 && local < n_real ? to_f(row[local]) : 0.0f;
  }
}

template <int K>
__global__ void vp_ce_finish_kernel(float* losses, bf16* logits, const float* stats, const int32_t* targets, int64_t N,
                                    int64_t Vl, int64_t v0, int64_t n_real, float dloss, bool write_grad) {
  const int64_t n = blockIdx.x;
  bf16* row = logits + n * Vl;
  const int32_t t = targets[n];
  if (t < 0) {
    if (threadIdx.x == 0) losses[n] = 0.0f;
    if (write_grad) zero_row<K>(row, Vl);
    return;
  }
  const float lse = stats[n] + logf(stats[N + n]);
  if (threadIdx.x == 0) losses[n] = lse - stats[2 * N + n];
  const int64_t local = static_cast<int64_t>(t) - v0;
  if (write_grad) write_grad_row<K>(row, row, Vl, n_real, lse, local >= 0 && local < n_real ? local : -1, dloss);
}

// 16-byte packs when every row starts 16-byte aligned.
bool packable(const void* p, int64_t width) { return aligned16(p) && width % 8 == 0; }

}  // namespace

void cross_entropy(cudaStream_t s, float* losses, bf16* logits, const int32_t* targets, int64_t N, int64_t Vp,
                   int64_t V, float dloss, bool write_grad, int* err) {
  if (N <= 0) return;
  const unsigned grid = static_cast<unsigned>(N);
  if (packable(logits, Vp) && ce_row_fits_smem(Vp))
    cross_entropy_kernel<8, true><<<grid, kThreads, static_cast<size_t>(Vp) * sizeof(bf16), s>>>(losses, logits,
                                                                                                 targets, Vp, V, dloss,
                                                                                                 write_grad, err);
  else if (packable(logits, Vp))
    cross_entropy_kernel<8, false><<<grid, kThreads, 0, s>>>(losses, logits, targets, Vp, V, dloss, write_grad, err);
  else
    cross_entropy_kernel<1, false><<<grid, kThreads, 0, s>>>(losses, logits, targets, Vp, V, dloss, write_grad, err);
  check_launch("cross_entropy_kernel");
}

void vp_ce_max(cudaStream_t s, float* stats, const bf16* logits, int64_t N, int64_t Vl, int64_t n_real) {
  if (N <= 0) return;
  const unsigned grid = static_cast<unsigned>(N);
  if (packable(logits, Vl))
    vp_ce_max_kernel<8><<<grid, kThreads, 0, s>>>(stats, logits, Vl, n_real);
  else
    vp_ce_max_kernel<1><<<grid, kThreads, 0, s>>>(stats, logits, Vl, n_real);
  check_launch("vp_ce_max_kernel");
}

void vp_ce_sums(cudaStream_t s, float* stats, const bf16* logits, const int32_t* targets, int64_t N, int64_t Vl,
                int64_t v0, int64_t n_real, int64_t V, int* err) {
  if (N <= 0) return;
  const unsigned grid = static_cast<unsigned>(N);
  if (packable(logits, Vl))
    vp_ce_sums_kernel<8><<<grid, kThreads, 0, s>>>(stats, logits, targets, N, Vl, v0, n_real, V, err);
  else
    vp_ce_sums_kernel<1><<<grid, kThreads, 0, s>>>(stats, logits, targets, N, Vl, v0, n_real, V, err);
  check_launch("vp_ce_sums_kernel");
}

void vp_ce_finish(cudaStream_t s, float* losses, bf16* logits, const float* stats, const int32_t* targets, int64_t N,
                  int64_t Vl, int64_t v0, int64_t n_real, float dloss, bool write_grad) {
  if (N <= 0) return;
  const unsigned grid = static_cast<unsigned>(N);
  if (packable(logits, Vl))
    vp_ce_finish_kernel<8>
        <<<grid, kThreads, 0, s>>>(losses, logits, stats, targets, N, Vl, v0, n_real, dloss, write_grad);
  else
    vp_ce_finish_kernel<1>
        <<<grid, kThreads, 0, s>>>(losses, logits, stats, targets, N, Vl, v0, n_real, dloss, write_grad);
  check_launch("vp_ce_finish_kernel");
}

}  // namespace mt::cuda
