// LayerNorm and RMSNorm over the last dimension, one row per loop iteration.
#include <algorithm>
#include <cmath>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

// Parameter gradients summed over rows: each thread adds into its own slice of a scratch block, and the slices
// are added in thread order afterwards (deterministic for a fixed thread count; no atomics).
class ParamGradPartials {
 public:
  ParamGradPartials(int64_t rows, int64_t width) : width_(width) {
    threads_ = rows * width > kParallelMin ? omp_get_max_threads() : 1;
    buf_ = thread_scratch(static_cast<size_t>(threads_ * width));
    std::fill(buf_, buf_ + threads_ * width, 0.0f);
  }
  int threads() const { return threads_; }
  float* slice(int tid) const { return buf_ + tid * width_; }
  // dst[j] += sum over threads of slice[j], for j in [offset, offset + n)
  // dst += the threads' partials in thread order; accumulate false: dst starts from zero (the same bits as zeroing
  // it first).
  void add_to(float* dst, int64_t offset, int64_t n, bool accumulate) const {
    if (!accumulate) std::fill(dst, dst + n, 0.0f);
    for (int t = 0; t < threads_; ++t) {
      const float* s = slice(t) + offset;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) dst[j] += s[j];
    }
  }

 private:
  int64_t width_;
  int threads_;
  float* buf_;
};

}  // namespace

void CpuOps::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
  const char* op = "layernorm_forward";
  float* o = f32_arg(out, op, "out");
  float* mu = f32_opt(mean, op, "mean");
  float* rs = f32_opt(rstd, op, "rstd");
  const float* x = f32_arg(inp, op, "inp");
  const float* wt = f32_arg(w, op, "w");
  const float* bs = f32_opt(b, op, "b");
  const auto [N, C] = layernorm_dims(op, out, mean, rstd, inp, w, b);
  const float invC = 1.0f / static_cast<float>(C);
#pragma omp parallel for if (N * C > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* orow = o + n * C;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += xr[c];
    const float m = sum * invC;
    float var = 0;  // two passes (mean, then squared deviations): no cancellation for rows far from zero
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    const float r = 1.0f / std::sqrt(var * invC + eps);
    if (bs) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) orow[c] = (xr[c] - m) * r * wt[c] + bs[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) orow[c] = (xr[c] - m) * r * wt[c];
    }
    if (mu) mu[n] = m;
    if (rs) rs[n] = r;
  }
}

void CpuOps::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                Tensor rstd, bool accumulate_dw) {
  const char* op = "layernorm_backward";
  float* dx = f32_arg(dinp, op, "dinp");
  float* dwt = f32_arg(dw, op, "dw");
  float* dbs = f32_opt(db, op, "db");
  const float* dy = f32_arg(dout, op, "dout");
  const float* x = f32_arg(inp, op, "inp");
  const float* wt = f32_arg(w, op, "w");
  const float* mu = f32_arg(mean, op, "mean");
  const float* rs = f32_arg(rstd, op, "rstd");
  const auto [N, C] = layernorm_backward_dims(op, dinp, dw, db, dout, inp, w, mean, rstd);
  const float invC = 1.0f / static_cast<float>(C);
  ParamGradPartials part(N, 2 * C);
#pragma omp parallel num_threads(part.threads())
  {
    float* pdw = part.slice(omp_get_thread_num());
    float* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* g = dy + n * C;
      float* dxr = dx + n * C;
      const float m = mu[n], r = rs[n];
      // dinp = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w, xhat = (x - m) * r
      float s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t c = 0; c < C; ++c) {
        const float dn = g[c] * wt[c];
        s1 += dn;
        s2 += dn * (xr[c] - m) * r;
      }
      s1 *= invC;
      s2 *= invC;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xh = (xr[c] - m) * r;
        dxr[c] += r * (g[c] * wt[c] - s1 - xh * s2);
        pdw[c] += g[c] * xh;
        pdb[c] += g[c];
      }
    }
  }
  part.add_to(dwt, 0, C, accumulate_dw);
  if (dbs) part.add_to(dbs, C, C, accumulate_dw);
}

void CpuOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) {
  const char* op = "rmsnorm_forward";
  float* o = f32_arg(out, op, "out");
  float* rs = f32_opt(rstd, op, "rstd");
  const float* x = f32_arg(inp, op, "inp");
  const float* wt = f32_arg(w, op, "w");
  const auto [N, C] = rmsnorm_dims(op, out, rstd, inp, w);
  const float invC = 1.0f / static_cast<float>(C);
#pragma omp parallel for if (N * C > kParallelMin) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* orow = o + n * C;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss * invC + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) orow[c] = xr[c] * r * wt[c];
    if (rs) rs[n] = r;
  }
}

void CpuOps::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd,
                              bool accumulate_dw) {
  const char* op = "rmsnorm_backward";
  float* dx = f32_arg(dinp, op, "dinp");
  float* dwt = f32_arg(dw, op, "dw");
  const float* dy = f32_arg(dout, op, "dout");
  const float* x = f32_arg(inp, op, "inp");
  const float* wt = f32_arg(w, op, "w");
  const float* rs = f32_arg(rstd, op, "rstd");
  const auto [N, C] = rmsnorm_backward_dims(op, dinp, dw, dout, inp, w, rstd);
  const float invC = 1.0f / static_cast<float>(C);
  ParamGradPartials part(N, C);
#pragma omp parallel num_threads(part.threads())
  {
    float* pdw = part.slice(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      const float* g = dy + n * C;
      float* dxr = dx + n * C;
      const float r = rs[n];
      // dinp = r * (dnorm - xhat * mean(dnorm * xhat)), dnorm = dout * w, xhat = x * r
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += g[c] * wt[c] * xr[c] * r;
      s *= invC;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xh = xr[c] * r;
        dxr[c] += r * (g[c] * wt[c] - xh * s);
        pdw[c] += g[c] * xh;
      }
    }
  }
  part.add_to(dwt, 0, C, accumulate_dw);
}

}  // namespace mt
