// Attention through cuDNN's fused flash-attention engines (the backend graph API), the alternative to our own kernel
// (flash_attention.h) that CudaOps uses when made with CudaOptions::attention = "cudnn". Same contract as
// flash_attention.h (see AttnShape in ops.h):
//   qkv  BF16 [B, T, (H + 2*Hkv) * hd], rows packed [q heads | k heads | v heads]
//   out  BF16 [B, T, H * hd]
//   lse  F32  [B, H, T]: natural-log log-sum-exp over the visible keys of the scaled scores q.k / sqrt(hd)
//   dqkv BF16 [B, T, (H + 2*Hkv) * hd], overwritten; dk and dv of a kv head summed over its query heads.
// Token t attends to key s when s <= t and, with a window W > 0, s > t - W. No copies: Q, K, V, dQ, dK and dV are
// strided views of the packed rows (dims [B, heads, T, hd], strides [T*width, hd, width, 1]).
//
// lse is cuDNN's softmax "Stats" tensor as it is: the graph computes it as max + log(sum exp(s - max)) over the
// masked, scaled scores (natural log), which is our lse, so forward and backward of either implementation can read
// the other's lse.
//
// The graphs follow the pattern cuDNN's fused SDPA engines match (the one cuDNN's frontend library emits for its
// composite SDPA node): forward matmul -> scale -> mask -> softmax (max, sub, exp, sum, log, add = Stats; div) ->
// matmul; backward as described in cudnn_attention.cpp. A plan (graph, engine from heuristics mode A, execution plan)
// is built once per shape and direction and cached. A shape no engine takes throws mt::Error naming the shape, the
// failing call and cuDNN's own message, and suggesting attention = "flash"; nothing is launched then.
//
// Without cuDNN in the build (CMake found no libcudnn: MT_HAVE_CUDNN undefined) the class still exists, available()
// is false and the constructor throws saying so.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "megatrain/kernels/ops.h"

namespace mt {

class CudnnAttention {
 public:
  // Whether this build links cuDNN.
  static bool available();

  // A cuDNN handle bound to `stream` (all calls are asynchronous on it) on the current device.
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Deterministic mode (train.deterministic): from now on plans are built only from engine configs whose engine is
  // not marked CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, so every execution repeats bit for bit. When cuDNN proposes
  // no other for a shape and direction, has_deterministic() says so and forward/backward of it throw naming the
  // problem. Call it before the first attention op.
  void set_deterministic(bool on);
  // Whether shape s has a plan for the direction (builds and caches it); always true unless deterministic.
  bool has_deterministic(const AttnShape& s, bool backward);

  // Checks that cuDNN can run shape s (builds and caches both plans) and sizes the workspace for it now, outside the
  // training step. Throws naming the shape when cuDNN refuses it.
  void reserve(const AttnShape& s);

  void forward(const AttnShape& s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse);
  // Reads lse as forward wrote it (either implementation's: the conventions are the same).
  void backward(const AttnShape& s, const __nv_bfloat16* qkv, const __nv_bfloat16* out, const __nv_bfloat16* dout,
                const float* lse, __nv_bfloat16* dqkv);

  // Bytes of device workspace held now (cuDNN's plan workspace plus the backward's fp32 dQ accumulator and
  // softmax-sum buffers).
  size_t workspace_bytes() const;

  // "cuDNN 9.19.0" (the library loaded at run time, which may differ from the headers built against).
  static std::string version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
