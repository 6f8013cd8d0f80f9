// AdamW and LAMB ops (kernels in optimizer_kernels.cu) over fp32 master weights, gradients and moments.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

// The CPU backend's constants (op_shapes.h's adam_consts), with the learning rate for the kernels.
cuda::AdamConsts kernel_consts(const char* op, const AdamHParams& h) {
  const AdamConsts k = adam_consts(op, h);
  return {k.b1, k.b2, k.one_minus_b1, k.one_minus_b2, k.inv_bc1, k.inv_bc2, k.eps, k.wd, k.gs, h.lr};
}

}  // namespace

void CudaOps::adamw_update(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "adamw_update";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  cuda::adamw_update(stream_, p, g, m, v, n, kernel_consts(op, h));
}

double CudaOps::lamb_moments(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "lamb_moments";
  int blocks = 0;
  {
    auto scope = timed(op);
    const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
    const float* g = f32_arg(grad, op, "grad");
    check_numel(grad, n, op, "grad");
    blocks = cuda::lamb_moments(stream_, p, g, m, v, n, kernel_consts(op, h), partials_dev_);
  }
  return sum_partials(blocks);
}

void CudaOps::lamb_apply(Tensor param, Tensor m_t, Tensor v_t, const AdamHParams& h, float trust) {
  const char* op = "lamb_apply";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cuda_args::f32_arg);
  cuda::lamb_apply(stream_, p, m, v, n, kernel_consts(op, h), h.lr * trust);
}

}  // namespace mt
