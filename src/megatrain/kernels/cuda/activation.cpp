// GeLU and SwiGLU ops (kernels in activation_kernels.cu), bf16 in and out.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

void CudaOps::gelu_forward(Tensor out, Tensor inp) {
  const char* op = "gelu_forward";
  auto scope = timed(op);
  auto* o = bf16_arg(out, op, "out");
  const auto* x = bf16_arg(inp, op, "inp");
  gelu_numel(op, out, inp);
  cuda::gelu_forward(stream_, o, x, inp.numel());
}

void CudaOps::gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "gelu_backward";
  auto scope = timed(op);
  auto* dx = bf16_arg(dinp, op, "dinp");
  const auto* x = bf16_arg(inp, op, "inp");
  const auto* dy = bf16_arg(dout, op, "dout");
  const int64_t n = gelu_backward_numel(op, dinp, inp, dout);
  cuda::gelu_backward(stream_, dx, x, dy, n);
}

void CudaOps::swiglu_forward(Tensor out, Tensor inp) {
  const char* op = "swiglu_forward";
  auto scope = timed(op);
  auto* o = bf16_arg(out, op, "out");
  const auto* x = bf16_arg(inp, op, "inp");
  const auto [N, F] = swiglu_dims(op, out, inp);
  cuda::swiglu_forward(stream_, o, x, N, F);
}

void CudaOps::swiglu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "swiglu_backward";
  auto scope = timed(op);
  auto* dx = bf16_arg(dinp, op, "dinp");
  const auto* x = bf16_arg(inp, op, "inp");
  const auto* dy = bf16_arg(dout, op, "dout");
  const auto [N, F] = swiglu_backward_dims(op, dinp, inp, dout);
  cuda::swiglu_backward(stream_, dx, x, dy, N, F);
}

}  // namespace mt
