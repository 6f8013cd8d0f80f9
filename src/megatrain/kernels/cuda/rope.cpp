// Rotary position embedding ops (kernel in rope_kernels.cu), in place on bf16 qkv.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

void rotate(const char* op, cudaStream_t stream, Tensor qkv, const AttnShape& s, const RopeFreqs& f, float sign) {
  auto* x = bf16_arg(qkv, op, "qkv");
  check_rope(op, qkv, s, f);
  cuda::rope(stream, x, s.B, s.T, s.n_head, s.n_kv_head, s.head_dim, f, sign);
}

}  // namespace

void CudaOps::rope_forward(Tensor qkv, const AttnShape& s, const RopeFreqs& f) {
  auto scope = timed("rope_forward");
  rotate("rope_forward", stream_, qkv, s, f, 1.0f);
}

void CudaOps::rope_backward(Tensor dqkv, const AttnShape& s, const RopeFreqs& f) {
  auto scope = timed("rope_backward");
  rotate("rope_backward", stream_, dqkv, s, f, -1.0f);
}

}  // namespace mt
