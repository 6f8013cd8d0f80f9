// The boundary between flash attention's host code (flash_attention.cpp: argument checks, mt::Error) and its
// kernels (flash_attention.cu). CUDA headers only: nvcc's C++20 front end rejects fmt's consteval format strings,
// which every mt header with MT_CHECK pulls in. Arguments here are already validated; launchers report the first
// failing CUDA call in a Status for the host code to raise.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mt::flash {

#if defined(__CUDACC__)
#define MT_FLASH_HD __host__ __device__
#else
#define MT_FLASH_HD
#endif

using bf16 = __nv_bfloat16;

// AttnShape as the kernels see it (ops.h's AttnShape is not visible here). hd is 64 or 128.
struct Problem {
  int B = 0, T = 0, H = 0, Hkv = 0, hd = 0, window = 0;
};

struct Status {
  cudaError_t err = cudaSuccess;
  const char* what = "";  // the CUDA call or kernel launch that failed
};

// Queries and keys are processed in tiles of kTile rows.
constexpr int kTile = 64;

// Forward: the key tiles [first, last] that query tile qb must visit. Tiles outside hold no visible pair, which is
// what makes a window W cost O(T * W) instead of O(T^2). Kept here (host and device) so a CPU test can check it.
MT_FLASH_HD inline void key_tiles_of_query_tile(int T, int window, int qb, int& first, int& last) {
  const int q0 = qb * kTile;
  const int q_last = (q0 + kTile < T ? q0 + kTile : T) - 1;                       // the tile's last real query
  const int k_lo = window > 0 ? (q0 - window + 1 > 0 ? q0 - window + 1 : 0) : 0;  // the first key q0 may see
  first = k_lo / kTile;
  last = q_last / kTile;  // causal: no key after the tile's last query
}

// Backward: the query tiles [first, last] that key tile kb must visit (those holding a query that sees one of
// its keys). Key s is seen by the queries t in [s, s + W - 1] (window W) or [s, T - 1] (full causal).
MT_FLASH_HD inline void query_tiles_of_key_tile(int T, int window, int kb, int& first, int& last) {
  const int k0 = kb * kTile;
  const int k_last = (k0 + kTile < T ? k0 + kTile : T) - 1;
  const int t_hi = window > 0 ? (k_last + window - 1 < T - 1 ? k_last + window - 1 : T - 1) : T - 1;
  first = k0 / kTile;
  last = t_hi / kTile;
}

// out [B, T, H*hd] and lse [B, H, T] from qkv [B, T, (H + 2 Hkv) hd].
Status launch_forward(cudaStream_t stream, const Problem& p, const bf16* qkv, bf16* out, float* lse);

// dqkv (overwritten) from qkv, out, dout, lse. dq_acc: fp32 [B, T, H*hd] scratch, Dvec: fp32 [B, H, T] scratch.
// deterministic: dq_acc is not used; dq comes from a kernel of its own, one block per query tile (no atomics).
Status launch_backward(cudaStream_t stream, const Problem& p, const bf16* qkv, const bf16* out, const bf16* dout,
                       const float* lse, bf16* dqkv, float* dq_acc, float* Dvec, bool deterministic = false);

}  // namespace mt::flash
