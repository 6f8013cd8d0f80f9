// GeLU and SwiGLU ops (kernels in activation_kernels.cu), bf16 in and out.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

void swiglu_dims(const char* op, const Tensor& inp, int64_t& N, int64_t& F) {
  MT_CHECK(inp.ndim >= 1 && inp.size(-1) % 2 == 0 && inp.size(-1) > 0,
           "{}: input {} must end in an even width 2F = [gate | up]", op, inp.shape_str());
  F = inp.size(-1) / 2;
  N = inp.numel() / (2 * F);
}

}  // namespace

void CudaOps::gelu_forward(Tensor out, Tensor inp) {
  const char* op = "gelu_forward";
  auto scope = timed(op);
  auto* o = bf16_arg(out, op, "out");
  const auto* x = bf16_arg(inp, op, "inp");
  check_numel(out, inp.numel(), op, "out");
  cuda::gelu_forward(stream_, o, x, inp.numel());
}

void CudaOps::gelu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "gelu_backward";
  auto scope = timed(op);
  auto* dx = bf16_arg(dinp, op, "dinp");
  const auto* x = bf16_arg(inp, op, "inp");
  const auto* dy = bf16_arg(dout, op, "dout");
  const int64_t n = inp.numel();
  check_numel(dinp, n, op, "dinp");
  check_numel(dout, n, op, "dout");
  cuda::gelu_backward(stream_, dx, x, dy, n);
}

void CudaOps::swiglu_forward(Tensor out, Tensor inp) {
  const char* op = "swiglu_forward";
  auto scope = timed(op);
  auto* o = bf16_arg(out, op, "out");
  const auto* x = bf16_arg(inp, op, "inp");
  int64_t N, F;
  swiglu_dims(op, inp, N, F);
  check_numel(out, N * F, op, "out");
  cuda::swiglu_forward(stream_, o, x, N, F);
}

void CudaOps::swiglu_backward(Tensor dinp, Tensor inp, Tensor dout) {
  const char* op = "swiglu_backward";
  auto scope = timed(op);
  auto* dx = bf16_arg(dinp, op, "dinp");
  const auto* x = bf16_arg(inp, op, "inp");
  const auto* dy = bf16_arg(dout, op, "dout");
  int64_t N, F;
  swiglu_dims(op, inp, N, F);
  check_numel(dinp, N * 2 * F, op, "dinp");
  check_numel(dout, N * F, op, "dout");
  cuda::swiglu_backward(stream_, dx, x, dy, N, F);
}

}  // namespace mt
