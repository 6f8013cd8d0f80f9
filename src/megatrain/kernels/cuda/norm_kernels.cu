// LayerNorm and RMSNorm over the last dimension C of bf16 rows, fp32 statistics.
//
// Forward: one warp per row (8 rows per 256-thread block). A row is read three times (sum, squared deviations,
// output) - two passes for the variance, as the CPU reference, so rows far from zero lose nothing to cancellation;
// the second and third reads hit L1/L2, so DRAM sees one read and one write per element. With the fused residual
// add the first pass writes res = a + b (rounded to bf16: the value the backward will see as the norm's input)
// and the later passes read it back (the same lane wrote it, so no sync is needed).
//
// Backward: dinp needs two row reductions (mean of dnorm and of dnorm * xhat), dw/db need sums over all rows.
// One block walks a contiguous chunk of rows, one row at a time; thread t owns columns t, t + blockDim, ... and
// accumulates their dw/db in shared memory (no atomics: nobody else touches those columns). Each block then
// writes its partial dw/db row to scratch, and a second kernel adds the partials in block order into dw/db:
// deterministic, and the only global traffic beyond the rows is G * C floats.
#include "megatrain/kernels/cuda/device_util.cuh"

namespace mt::cuda {

namespace {

constexpr int kFwdThreads = 256;  // 8 warps = 8 rows per block
constexpr int kBwdThreads = 256;

template <int K, bool kRms, bool kAdd>
__global__ void norm_forward_kernel(NormForwardArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= a.N) return;  // whole warps leave together: the shuffles below stay full-warp
  const int64_t C = a.C;
  const float invC = 1.0f / static_cast<float>(C);
  const bf16* x = (kAdd ? a.res : a.inp) + row * C;  // the row being normalised (res is complete after pass 1)

  // Pass 1: sum (LayerNorm) or sum of squares (RMSNorm); with kAdd, also res = inp + add_b.
  float s = 0;
  for (int64_t c = lane * K; c < C; c += kWarp * K) {
    Pack<K, bf16> v = load_pack<K>(a.inp + row * C + c);
    if constexpr (kAdd) {
      const Pack<K, bf16> y = load_pack<K>(a.add_b + row * C + c);
#pragma unroll
      for (int k = 0; k < K; ++k) v.v[k] = from_f<bf16>(to_f(v.v[k]) + to_f(y.v[k]));
      store_pack<K>(a.res + row * C + c, v);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float f = to_f(v.v[k]);
      s += kRms ? f * f : f;
    }
  }
  s = warp_sum(s);

  float mean = 0, rstd;
  if constexpr (kRms) {
    rstd = 1.0f / sqrtf(s * invC + a.eps);
  } else {
    mean = s * invC;
    float var = 0;  // pass 2: squared deviations from the mean
    for (int64_t c = lane * K; c < C; c += kWarp * K) {
      const Pack<K, bf16> v = load_pack<K>(x + c);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float d = to_f(v.v[k]) - mean;
        var += d * d;
      }
    }
    var = warp_sum(var);
    rstd = 1.0f / sqrtf(var * invC + a.eps);
  }

  // Pass 3: out = (x - mean) * rstd * w (+ b)
  for (int64_t c = lane * K; c < C; c += kWarp * K) {
    const Pack<K, bf16> v = load_pack<K>(x + c);
    const Pack<K, bf16> w = load_pack<K>(a.w + c);
    Pack<K, bf16> b{};
    if (!kRms && a.b) b = load_pack<K>(a.b + c);
    Pack<K, bf16> o;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float y = (to_f(v.v[k]) - mean) * rstd * to_f(w.v[k]);
      if (!kRms && a.b) y += to_f(b.v[k]);
      o.v[k] = from_f<bf16>(y);
    }
    store_pack<K>(a.out + row * C + c, o);
  }
  if (lane == 0) {
    if (!kRms && a.mean) a.mean[row] = mean;
    if (a.rstd) a.rstd[row] = rstd;
  }
}

// Block g handles rows [g * rows_per_block, ...). partial is [G, width * C] (width 2 for LayerNorm: dw then db).
//   xhat = (x - mean) * rstd, dnorm = dout * w
//   LayerNorm: dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
//   RMSNorm:   dinp += rstd * (dnorm - xhat * mean(dnorm * xhat))          (mean = 0)
//   dw += dout * xhat, db += dout
template <bool kRms>
__global__ void norm_backward_kernel(NormBackwardArgs a, float* partial, int64_t rows_per_block) {
  extern __shared__ float acc[];  // [width * C]: this block's dw (then db) partial sums
  constexpr int width = kRms ? 1 : 2;
  const int64_t C = a.C;
  const float invC = 1.0f / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < width * C; c += blockDim.x) acc[c] = 0.0f;
  __syncthreads();  // the zeroing above does not follow the column ownership used below

  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < a.N ? r0 + rows_per_block : a.N;
  for (int64_t row = r0; row < r1; ++row) {
    const bf16* x = a.inp + row * C;
    const bf16* g = a.dout + row * C;
    bf16* dx = a.dinp + row * C;
    const float m = kRms ? 0.0f : a.mean[row], r = a.rstd[row];
    float s1 = 0, s2 = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float dn = to_f(g[c]) * to_f(a.w[c]);
      s1 += dn;
      s2 += dn * (to_f(x[c]) - m) * r;
    }
    s2 = block_sum(s2) * invC;
    if constexpr (!kRms) s1 = block_sum(s1) * invC;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float gc = to_f(g[c]);
      const float xh = (to_f(x[c]) - m) * r;
      const float dn = gc * to_f(a.w[c]);
      const float d = kRms ? r * (dn - xh * s2) : r * (dn - s1 - xh * s2);
      dx[c] = from_f<bf16>(to_f(dx[c]) + d);
      acc[c] += gc * xh;
      if constexpr (!kRms) acc[C + c] += gc;
    }
  }
  // Same column ownership as the loop above: each thread publishes what it accumulated.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    partial[blockIdx.x * width * C + c] = acc[c];
    if constexpr (!kRms) partial[blockIdx.x * width * C + C + c] = acc[C + c];
  }
}

// dw[c] += sum_g partial[g, c]; db[c] += sum_g partial[g, C + c]; in block order.
__global__ void norm_param_grad_kernel(float* dw, float* db, const float* partial, int64_t C, int64_t G, int width) {
  for (int64_t c = global_thread(); c < C; c += grid_threads()) {
    float sw = 0, sb = 0;
    for (int64_t g = 0; g < G; ++g) {
      sw += partial[g * width * C + c];
      if (width == 2) sb += partial[g * width * C + C + c];
    }
    dw[c] += sw;
    if (db) db[c] += sb;
  }
}

template <int K>
void launch_forward(cudaStream_t s, const NormForwardArgs& a) {
  const int rows_per_block = kFwdThreads / kWarp;
  const unsigned grid = static_cast<unsigned>((a.N + rows_per_block - 1) / rows_per_block);
  if (a.rms) {
    if (a.add_b)
      norm_forward_kernel<K, true, true><<<grid, kFwdThreads, 0, s>>>(a);
    else
      norm_forward_kernel<K, true, false><<<grid, kFwdThreads, 0, s>>>(a);
  } else {
    if (a.add_b)
      norm_forward_kernel<K, false, true><<<grid, kFwdThreads, 0, s>>>(a);
    else
      norm_forward_kernel<K, false, false><<<grid, kFwdThreads, 0, s>>>(a);
  }
  check_launch("norm_forward_kernel");
}

// Opts the kernel in to more than the default 48 KiB of dynamic shared memory when it needs it.
template <class Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  int dev = 0, optin = 0;
  check(cudaGetDevice(&dev), "norm_backward: cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "norm_backward: cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  if (bytes > static_cast<size_t>(optin))
    check(cudaErrorInvalidValue, "norm_backward: C is too wide for the per-block dw/db accumulators in shared memory");
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "norm_backward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

}  // namespace

void norm_forward(cudaStream_t s, const NormForwardArgs& a) {
  if (a.N <= 0) return;
  const bool aligned = aligned16(a.out) && aligned16(a.inp) && aligned16(a.w) && (!a.b || aligned16(a.b)) &&
                       (!a.add_b || (aligned16(a.add_b) && aligned16(a.res)));
  if (a.C % 8 == 0 && aligned)
    launch_forward<8>(s, a);
  else
    launch_forward<1>(s, a);
}

void norm_backward(cudaStream_t s, const NormBackwardArgs& a) {
  if (a.N <= 0) return;
  const int width = a.rms ? 1 : 2;
  const int64_t row_floats = width * a.C;
  if (static_cast<size_t>(row_floats) > a.scratch_floats)
    check(cudaErrorInvalidValue, "norm_backward: C is too wide for the reduction scratch");
  // Blocks: enough to fill the GPU (~16 rows each), at most 1024 partial rows, and as many as the scratch holds.
  int64_t G = (a.N + 15) / 16;
  if (G > 1024) G = 1024;
  const int64_t fit = static_cast<int64_t>(a.scratch_floats) / row_floats;
  if (G > fit) G = fit;
  const int64_t rows_per_block = (a.N + G - 1) / G;
  G = (a.N + rows_per_block - 1) / rows_per_block;
  const size_t smem = static_cast<size_t>(row_floats) * sizeof(float);
  if (a.rms) {
    set_smem(norm_backward_kernel<true>, smem);
    norm_backward_kernel<true><<<static_cast<unsigned>(G), kBwdThreads, smem, s>>>(a, a.scratch, rows_per_block);
  } else {
    set_smem(norm_backward_kernel<false>, smem);
    norm_backward_kernel<false><<<static_cast<unsigned>(G), kBwdThreads, smem, s>>>(a, a.scratch, rows_per_block);
  }
  check_launch("norm_backward_kernel");
  norm_param_grad_kernel<<<grid_for(a.C, 256), 256, 0, s>>>(a.dw, a.rms ? nullptr : a.db, a.scratch, a.C, G, width);
  check_launch("norm_param_grad_kernel");
}

}  // namespace mt::cuda
