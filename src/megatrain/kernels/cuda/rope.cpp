// Rotary position embedding ops (kernel in rope_kernels.cu), in place on bf16 qkv.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

void rotate(const char* op, cudaStream_t stream, Tensor qkv, const AttnShape& s, float theta, float sign) {
  auto* x = bf16_arg(qkv, op, "qkv");
  MT_CHECK(s.B > 0 && s.T > 0 && s.n_head > 0 && s.n_kv_head > 0, "{}: bad attention shape", op);
  MT_CHECK(s.head_dim > 0 && s.head_dim % 2 == 0, "{}: head_dim must be even and positive (got {})", op, s.head_dim);
  MT_CHECK(theta > 0, "{}: theta must be positive (got {})", op, theta);
  check_numel(qkv, int64_t{s.B} * s.T * s.qkv_width(), op, "qkv");
  cuda::rope(stream, x, s.B, s.T, s.n_head, s.n_kv_head, s.head_dim, theta, sign);
}

}  // namespace

void CudaOps::rope_forward(Tensor qkv, const AttnShape& s, float theta) {
  auto scope = timed("rope_forward");
  rotate("rope_forward", stream_, qkv, s, theta, 1.0f);
}

void CudaOps::rope_backward(Tensor dqkv, const AttnShape& s, float theta) {
  auto scope = timed("rope_backward");
  rotate("rope_backward", stream_, dqkv, s, theta, -1.0f);
}

}  // namespace mt
