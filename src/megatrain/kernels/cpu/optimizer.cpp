// AdamW and LAMB updates over flat fp32 parameter, gradient and moment buffers (the constants: op_shapes.h).
#include <cmath>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

void CpuOps::adamw_update(Tensor param, Tensor grad, Tensor m_t, Tensor v_t, const AdamHParams& h) {
  const char* op = "adamw_update";
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cpu::f32_arg);
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
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cpu::f32_arg);
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
  const auto [p, m, v, n] = opt_args(op, param, m_t, v_t, cpu::f32_arg);
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
