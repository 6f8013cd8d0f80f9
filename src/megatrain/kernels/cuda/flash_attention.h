// Flash attention for the CUDA backend (FlashAttention-2 style): causal or sliding-window attention with GQA,
// bf16 in and out, fp32 accumulation, never materialising the T x T score matrix.
//
// Layouts (the same as the CPU reference, kernels/cpu/attention.cpp; see AttnShape in ops.h):
//   qkv  BF16 [B, T, (H + 2*Hkv) * hd], each row packed [q heads | k heads | v heads]
//   out  BF16 [B, T, H * hd]
//   lse  F32  [B, H, T]: natural-log log-sum-exp over the visible keys of the scaled scores q.k / sqrt(hd)
//   dqkv BF16 [B, T, (H + 2*Hkv) * hd], overwritten; dk and dv of a kv head are summed over its query heads.
// Query head h reads kv head h / (H / Hkv). head_dim must be 64 or 128 (anything else throws mt::Error).
// Token t attends to key s when s <= t and, with a window W > 0, s > t - W.
// All pointers must be 16-byte aligned device memory. The calls are asynchronous on `stream`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "megatrain/kernels/ops.h"

namespace mt {

void flash_attention_forward(cudaStream_t stream, const AttnShape& s, const __nv_bfloat16* qkv, __nv_bfloat16* out,
                             float* lse);

// `workspace` is device memory of flash_attention_workspace_bytes(s) bytes (contents on entry do not matter).
// deterministic: dq from a pass of its own that sums over key tiles in a fixed order instead of fp32 atomics, so
// dqkv repeats bit for bit (dk and dv always do); slower, since that pass recomputes the scores.
void flash_attention_backward(cudaStream_t stream, const AttnShape& s, const __nv_bfloat16* qkv,
                              const __nv_bfloat16* out, const __nv_bfloat16* dout, const float* lse,
                              __nv_bfloat16* dqkv, float* workspace, bool deterministic = false);

// fp32 dq accumulator [B, T, H*hd] followed by D = rowsum(dout * out) [B, H, T].
size_t flash_attention_workspace_bytes(const AttnShape& s);

}  // namespace mt
