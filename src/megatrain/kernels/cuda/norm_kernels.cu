// LayerNorm and RMSNorm over the last dimension C of bf16 rows, fp32 statistics.
//
// Forward: one warp per row (8 rows per 256-thread block). A row is read three times (sum, squared deviations,
// output) - two passes for the variance, as the CPU reference, so rows far from zero lose nothing to cancellation;
// the second and third reads hit L1/L2, so DRAM sees one read and one write per element. With the fused residual
// add the first pass writes res = a + b (rounded to bf16: the value the backward will see as the norm's input)
// and the later passes read it back (the same lane wrote it, so no sync is needed).
//
// Backward: dinp needs two row reductions (mean of dnorm and of dnorm * xhat), dw/db need sums over all rows.
// One block walks a contiguous chunk of rows, one row at a time; each thread owns a fixed set of columns and
// accumulates their dw/db itself (no atomics: nobody else touches those columns). Each block then writes its
// partial dw/db row to scratch, and add_partial_rows (elementwise_kernels.cu) adds the partials in a fixed order
// into dw/db: deterministic, and the only global traffic beyond the rows is G * C floats. The vector path (C a
// multiple of 8, aligned rows) owns 8 consecutive columns per 16-byte pack, keeps w, the row's x and dout, and the
// dw/db sums in registers, and does one block reduction per row for both means. The scalar path (any C) keeps the
// sums in shared memory and reads a row twice. On an H100 the first version (the scalar path only, and a
// one-thread-per-column dw/db pass) took 12.6 ms of a 1.3B model's step for ~5 GB of traffic
// (bench/results/ncu_kernels-gpt-1.3b-nvidia-h100-80gb-hbm3.json).
#include <map>
#include <mutex>
#include <utility>

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

// Both sums of a row at once, returned to every thread: one pair of block barriers per row instead of two.
// blockDim.x must be a multiple of 32 (whole warps shuffle).
__device__ __forceinline__ float2 block_sum2(float a, float b) {
  __shared__ float2 warp_part[32];
  __shared__ float2 total;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) warp_part[warp] = make_float2(a, b);
  __syncthreads();
  if (warp == 0) {
    float2 y = lane < nwarps ? warp_part[lane] : make_float2(0.0f, 0.0f);
    y.x = warp_sum(y.x);
    y.y = warp_sum(y.y);
    if (lane == 0) total = y;
  }
  __syncthreads();  // the next row's call must not overwrite warp_part/total before everyone has read them
  return total;
}

// The vector path: thread t owns packs p = t + v * blockDim.x (v < V) of 8 columns each, p < C / 8.
// Why the loads come early: a block walks its rows one after another, and each row's block reduction (two barriers)
// stalls all of its warps. Issuing this row's dinp and (for V <= 2, where the registers allow) the next row's x and
// dout before the reduction keeps those loads in flight across the barriers. The version that loaded them after
// the reduction ran the 1.3B model's 49 norm backwards in 3.9 ms a step on the H100, ~55% of copy bandwidth for
// the bytes it moves (bench/results/ncu_kernels-gpt-1.3b-nvidia-h100-80gb-hbm3.json).
template <bool kRms, int V>
__global__ void norm_backward_vec_kernel(NormBackwardArgs a, float* partial, int64_t rows_per_block) {
  constexpr int width = kRms ? 1 : 2;
  constexpr bool kPrefetch = V <= 2;
  const int64_t C = a.C, packs = C / 8;
  const float invC = 1.0f / static_cast<float>(C);
  Pack<8, bf16> w[V];
  float dw[V][8] = {}, db[V][8] = {};  // db is dead code for RMSNorm
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t p = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
    if (p < packs) w[v] = load_pack<8>(a.w + p * 8);
  }
  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < a.N ? r0 + rows_per_block : a.N;
  Pack<8, bf16> xv[V], gv[V];  // the current row's x and dout
  auto load_row = [&](int64_t row, Pack<8, bf16>* x, Pack<8, bf16>* g) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
      if (p >= packs) continue;
      x[v] = load_pack<8>(a.inp + row * C + p * 8);
      g[v] = load_pack<8>(a.dout + row * C + p * 8);
    }
  };
  if (kPrefetch && r0 < r1) load_row(r0, xv, gv);
  for (int64_t row = r0; row < r1; ++row) {
    const float m = kRms ? 0.0f : a.mean[row], r = a.rstd[row];
    if (!kPrefetch) load_row(row, xv, gv);
    Pack<8, bf16> dv[V];  // this row's dinp, accumulated into below
    float s1 = 0, s2 = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
      if (p >= packs) continue;
      dv[v] = load_pack<8>(a.dinp + row * C + p * 8);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float dn = to_f(gv[v].v[k]) * to_f(w[v].v[k]);
        s1 += dn;
        s2 += dn * (to_f(xv[v].v[k]) - m) * r;
      }
    }
    Pack<8, bf16> xn[V], gn[V];  // the next row's, in flight across the reduction
    if (kPrefetch && row + 1 < r1) load_row(row + 1, xn, gn);
    const float2 sums = block_sum2(s1, s2);
    const float mean_dn = kRms ? 0.0f : sums.x * invC, mean_dnx = sums.y * invC;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t p = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
      if (p >= packs) continue;
      Pack<8, bf16>& d = dv[v];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float gc = to_f(gv[v].v[k]);
        const float xh = (to_f(xv[v].v[k]) - m) * r;
        const float dn = gc * to_f(w[v].v[k]);
        d.v[k] = from_f<bf16>(to_f(d.v[k]) + r * (dn - mean_dn - xh * mean_dnx));
        dw[v][k] += gc * xh;
        if constexpr (!kRms) db[v][k] += gc;
      }
      store_pack<8>(a.dinp + row * C + p * 8, d);
    }
    if (kPrefetch) {
#pragma unroll
      for (int v = 0; v < V; ++v) xv[v] = xn[v], gv[v] = gn[v];
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t p = threadIdx.x + static_cast<int64_t>(v) * blockDim.x;
    if (p >= packs) continue;
    float* out = partial + blockIdx.x * width * C + p * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      out[k] = dw[v][k];
      if constexpr (!kRms) out[C + k] = db[v][k];
    }
  }
}

// One wave of blocks: as many as the GPU holds at once (the kernel's occupancy times the SMs), each walking an
// equal share of the rows, so no second, part-empty wave trails the first. At N = 8192, C = 2048 on an H100 that
// should be 3 blocks of 256 threads per SM (ptxas: 80 registers a thread), 396 blocks of ~21 rows; the earlier fixed
// 16 rows per block gave 512 blocks, a full wave and a second one 29% full. G is also bounded by the rows, 1024 partial rows and the scratch (`fit`).
// The order of the dw/db sums follows G, so their bits are the same on every run on one kind of GPU, not across
// kinds (as with cuBLAS's own kernel choices).
// The occupancy query costs microseconds and a norm backward runs ~50 times a step, so the wave's size is kept per
// device and per block size (one cache per kernel instantiation).
template <class Kernel>
int64_t one_wave(Kernel kernel, unsigned threads, int64_t N, int64_t fit) {
  static std::mutex mu;
  static std::map<std::pair<int, unsigned>, int64_t> waves;  // (device, threads) -> blocks resident at once
  int dev = 0;
  check(cudaGetDevice(&dev), "norm_backward: cudaGetDevice");
  int64_t G;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = waves.find({dev, threads});
    if (it == waves.end()) {
      int sms = 0, per_sm = 0;
      check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
            "norm_backward: cudaDeviceGetAttribute(MultiProcessorCount)");
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(threads), 0),
            "norm_backward: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      it = waves.emplace(std::pair{dev, threads}, static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1)).first;
    }
    G = it->second;
  }
  if (G > 1024) G = 1024;
  if (G > fit) G = fit;
  if (G > N) G = N;
  return G < 1 ? 1 : G;
}

template <bool kRms, int V>
void launch_backward_vec_v(cudaStream_t s, const NormBackwardArgs& a, unsigned threads, int64_t fit) {
  const auto kernel = norm_backward_vec_kernel<kRms, V>;
  int64_t G = one_wave(kernel, threads, a.N, fit);
  const int64_t rows_per_block = (a.N + G - 1) / G;
  G = (a.N + rows_per_block - 1) / rows_per_block;  // no empty blocks
  kernel<<<static_cast<unsigned>(G), threads, 0, s>>>(a, a.scratch, rows_per_block);
  check_launch("norm_backward_vec_kernel");
  add_partial_rows(s, a.dw, kRms ? nullptr : a.db, a.C, a.scratch, (kRms ? 1 : 2) * a.C, G, a.accumulate_dw);
}

// The vector path's launch: V packs per thread (C up to 8192), one wave of blocks, then the dw/db second pass.
template <bool kRms>
void launch_backward_vec(cudaStream_t s, const NormBackwardArgs& a, int64_t fit) {
  const int64_t packs = a.C / 8;
  const int V = packs <= 256 ? 1 : packs <= 512 ? 2 : 4;
  const int64_t per_thread = (packs + V - 1) / V;
  const unsigned threads = static_cast<unsigned>((per_thread + kWarp - 1) / kWarp * kWarp);
  if (V == 1)
    launch_backward_vec_v<kRms, 1>(s, a, threads, fit);
  else if (V == 2)
    launch_backward_vec_v<kRms, 2>(s, a, threads, fit);
  else
    launch_backward_vec_v<kRms, 4>(s, a, threads, fit);
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
  const int64_t fit = static_cast<int64_t>(a.scratch_floats) / row_floats;  // partial rows the scratch holds
  // The vector path covers C up to 4 * 256 packs of 8 (8192 columns) in registers.
  const bool vec = a.C % 8 == 0 && a.C <= 8192 && aligned16(a.dinp) && aligned16(a.dout) && aligned16(a.inp) &&
                   aligned16(a.w);
  if (vec) {
    if (a.rms)
      launch_backward_vec<true>(s, a, fit);
    else
      launch_backward_vec<false>(s, a, fit);
    return;
  }
  // The scalar path: blocks of ~16 rows, at most 1024 partial rows, and as many as the scratch holds.
  int64_t G = (a.N + 15) / 16;
  if (G > 1024) G = 1024;
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
  // dw (and db) += the partial rows' column sums; db may be null (LayerNorm without bias): its half is then skipped.
  add_partial_rows(s, a.dw, a.rms ? nullptr : a.db, a.C, a.scratch, row_floats, G, a.accumulate_dw);
}

}  // namespace mt::cuda
