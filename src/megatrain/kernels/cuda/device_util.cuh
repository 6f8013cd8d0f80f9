// Device-side helpers shared by the kernels: fp32 <-> storage conversions, 16-byte packs, warp and block
// reductions, and grid sizing. Included by *_kernels.cu only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "megatrain/kernels/cuda/launch.h"

namespace mt::cuda {

constexpr int kWarp = 32;

// Every kernel computes in fp32; storage is float or bf16 (rounded to nearest even once, on store).
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// The host's float_to_bf16 (core/bf16.h) on the device, so a round trip through either side is bit-identical,
// NaN payloads included (__float2bfloat16_rn agrees on every non-NaN input).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// K consecutive elements moved as one load/store: K * sizeof(T) == 16 bytes gives 128-bit memory instructions, the
// widest a thread can issue; K == 1 is the fallback for unaligned pointers or widths that are not a multiple of K.
template <int K, class T>
struct alignas(K * sizeof(T)) Pack {
  T v[K];
};
template <int K, class T>
__device__ __forceinline__ Pack<K, T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<K, T>*>(p);
}
template <int K, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<K, T>& x) {
  *reinterpret_cast<Pack<K, T>*>(p) = x;
}
// Elements per 16-byte pack.
template <class T>
constexpr int kPack = 16 / static_cast<int>(sizeof(T));

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <class T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over the block, returned to every thread. Every thread of the block must call it (it syncs); safe to call
// repeatedly (the second sync keeps the next call's writes from racing this call's reads).
template <class T>
__device__ T block_sum(T x) {
  __shared__ T warp_part[32];
  __shared__ T total;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = (blockDim.x + kWarp - 1) / kWarp;
  x = warp_sum(x);
  if (lane == 0) warp_part[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T y = lane < nwarps ? warp_part[lane] : T(0);
    y = warp_sum(y);
    if (lane == 0) total = y;
  }
  __syncthreads();
  return total;
}

__device__ inline float block_max(float x) {
  __shared__ float warp_part[32];
  __shared__ float total;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = (blockDim.x + kWarp - 1) / kWarp;
  x = warp_max(x);
  if (lane == 0) warp_part[warp] = x;
  __syncthreads();
  if (warp == 0) {
    float y = lane < nwarps ? warp_part[lane] : -INFINITY;
    y = warp_max(y);
    if (lane == 0) total = y;
  }
  __syncthreads();
  return total;
}

// Blocks for a grid-stride loop over `work` items with `threads` per block: enough to fill any GPU many times over,
// capped so the index math stays cheap (the loop covers the rest).
inline unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace mt::cuda
