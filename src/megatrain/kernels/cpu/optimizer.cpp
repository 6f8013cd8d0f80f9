// AdamW and LAMB updates over flat fp32 parameter, gradient and moment buffers.
#include <cmath>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

// Per-call constants of the Adam moment update, bias corrections folded into reciprocals.
struct AdamConsts {
  float b1, b2, one_minus_b1, one_minus_b2, inv_bc1, inv_bc2, eps, wd, gs;
};

AdamConsts adam_consts(const char* op, const AdamHParams& h) {
  MT_CHECK(h.step >= 1, "{}: step must be >= 1 (1-based, for bias correction; got {})", op, h.step);
  MT_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
           "{}: beta1 ({}) and beta2 ({}) must be in [0, 1)", op, h.beta1, h.beta2);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), h.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), h.step);
  return {h.beta1, h.beta2, 1.0f - h.beta1, 1.0f - h.beta2, static_cast<float>(1.0 / bc1),
          static_cast<float>(1.0 / bc2), h.eps, h.weight_decay, h.grad_scale};
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

void CpuOps::adamw_update(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "adamw_update";
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  const AdamConsts k = adam_consts(op, h);
  const float lr = h.lr;
  parallel_blocks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float gi = g[i] * k.gs;
      const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
      const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] -= lr * (mi * k.inv_bc1 / (std::sqrt(vi * k.inv_bc2) + k.eps) + k.wd * p[i]);
    }
  });
}

double CpuOps::lamb_moments(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "lamb_moments";
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t);
  const float* g = f32_arg(grad, op, "grad");
  check_numel(grad, n, op, "grad");
  const AdamConsts k = adam_consts(op, h);
  return block_sum(n, [&](int64_t begin, int64_t end) {
    return lane_sum(begin, end, [&](int64_t i) {
      const float gi = g[i] * k.gs;
      const float mi = k.b1 * m[i] + k.one_minus_b1 * gi;
      const float vi = k.b2 * v[i] + k.one_minus_b2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float u = mi * k.inv_bc1 / (std::sqrt(vi * k.inv_bc2) + k.eps) + k.wd * p[i];
      return static_cast<double>(u) * u;
    });
  });
}

void CpuOps::lamb_apply(Tensor param, Tensor m_t, Tensor v_t, const AdamHParams& h, float trust) {
  const char* op = "lamb_apply";
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t);
  const AdamConsts k = adam_consts(op, h);
  const float step = h.lr * trust;
  parallel_blocks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float u = m[i] * k.inv_bc1 / (std::sqrt(v[i] * k.inv_bc2) + k.eps) + k.wd * p[i];
      p[i] -= step * u;
    }
  });
}

}  // namespace mt
