// AdamW and LAMB ops (kernels in optimizer_kernels.cu) over fp32 master weights, gradients and moments.
#include <cmath>

#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

namespace {

// The same constants as the CPU backend (bias corrections in double, folded into reciprocals).
cuda::AdamConsts adam_consts(const char* op, const AdamHParams& h) {
  MT_CHECK(h.step >= 1, "{}: step must be >= 1 (1-based, for bias correction; got {})", op, h.step);
  MT_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
           "{}: beta1 ({}) and beta2 ({}) must be in [0, 1)", op, h.beta1, h.beta2);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  return {h.beta1,      h.beta2, 1.0f - h.beta1,  1.0f - h.beta2, static_cast<float>(1.0 / bc1),
          static_cast<float>(1.0 / bc2), h.eps, h.weight_decay, h.grad_scale, h.lr};
}

struct OptArgs {
  float *p, *m, *v;
  int64_t n;
};

OptArgs opt_args(const char* op, Tensor param, Tensor m, Tensor v) {
  OptArgs a{f32_arg(param, op, "param"), f32_arg(m, op, "m"), f32_arg(v, op, "v"), param.numel()};
  check_numel(m, a.n, op, "m");
  check_numel(v, a.n, op, "v");
  return a;
}

}  // namespace

void CudaOps::adamw_update(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "adamw_update";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  cuda::adamw_update(stream_, p, g, m, v, n, adam_consts(op, h));
}

double CudaOps::lamb_moments(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "lamb_moments";
  int blocks = 0;
  {
    auto scope = timed(op);
    const auto [p, m, v, n] = opt_args(op, param, m_t, v_t);
    const float* g = f32_arg(grad, op, "grad");
    check_numel(grad, n, op, "grad");
    blocks = cuda::lamb_moments(stream_, p, g, m, v, n, adam_consts(op, h), partials_dev_);
  }
  return sum_partials(blocks);
}

void CudaOps::lamb_apply(Tensor param, Tensor m_t, Tensor v_t, const AdamHParams& h, float trust) {
  const char* op = "lamb_apply";
  auto scope = timed(op);
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t);
  cuda::lamb_apply(stream_, p, m, v, n, adam_consts(op, h), h.lr * trust);
}

}  // namespace mt
