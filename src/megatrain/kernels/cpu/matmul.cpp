// Linear layers on OpenBLAS sgemm. Row-major out[N,OC] = inp[N,C] @ w[OC,C]^T is sgemm(NoTrans, Trans).
#include <cblas.h>

#include <algorithm>

#include "megatrain/kernels/cpu/cpu_ops.h"
#include "megatrain/kernels/cpu/cpu_util.h"

namespace mt {

using namespace cpu;

namespace {

// The sizes of a linear layer (op_shapes.h), which must fit 32-bit BLAS.
struct BlasDims {
  int N, C, OC;
};

BlasDims blas_dims(const char* op, const Tensor& inp, const Tensor& w) {
  LinearDims d = weight_dims(op, w);
  d.N = linear_rows(op, inp, w, d.C);
  MT_CHECK(d.N * d.OC < (int64_t{1} << 31) && d.N * d.C < (int64_t{1} << 31), "{}: tensors too large for 32-bit BLAS",
           op);
  return {static_cast<int>(d.N), static_cast<int>(d.C), static_cast<int>(d.OC)};
}

}  // namespace

void CpuOps::matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) {
  const char* op = "matmul_forward";
  float* o = f32_arg(out, op, "out");
  const float* x = f32_arg(inp, op, "inp");
  const float* wt = f32_arg(w, op, "w");
  const float* b = f32_opt(bias, op, "bias");
  const auto [N, C, OC] = blas_dims(op, inp, w);
  check_numel(out, int64_t{N} * OC, op, "out");
  if (b) check_numel(bias, OC, op, "bias");
  if (N == 0 || OC == 0) return;
  // The bias is broadcast into out first and sgemm accumulates onto it (beta = 1): no extra pass after.
  if (b) {
#pragma omp parallel for if (int64_t{N} * OC > kParallelMin) schedule(static)
    for (int n = 0; n < N; ++n) {
      float* row = o + static_cast<size_t>(n) * OC;
#pragma omp simd
      for (int j = 0; j < OC; ++j) row[j] = b[j];
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, x, C, wt, C, b ? 1.0f : 0.0f, o, OC);
}

void CpuOps::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                             bool accumulate_dinp, bool accumulate_dw) {
  const char* op = "matmul_backward";
  float* dx = f32_opt(dinp, op, "dinp");
  float* dwt = f32_opt(dw, op, "dw");
  float* db = f32_opt(dbias, op, "dbias");
  const float* dy = f32_arg(dout, op, "dout");
  const float* wt = f32_arg(w, op, "w");
  // Without dw the input is not needed (inp may be undefined): the row count then comes from dinp.
  const float* x = dwt ? f32_arg(inp, op, "inp") : nullptr;
  MT_CHECK(inp.defined() || dx, "{}: needs inp or dinp (to know the row count)", op);
  const auto [N, C, OC] = blas_dims(op, inp.defined() ? inp : dinp, w);
  check_numel(dout, int64_t{N} * OC, op, "dout");
  if (dwt) check_numel(dw, int64_t{OC} * C, op, "dw");
  if (dx) check_numel(dinp, int64_t{N} * C, op, "dinp");
  if (db) check_numel(dbias, OC, op, "dbias");
  if (N == 0) {  // sums over no rows: nothing to add, or zeros to write
    if (!accumulate_dw && dwt) std::fill(dwt, dwt + int64_t{OC} * C, 0.0f);
    if (!accumulate_dw && db) std::fill(db, db + OC, 0.0f);
    return;
  }

  if (dx)  // dinp[N,C] = dout[N,OC] @ w[OC,C]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dy, OC, wt, C, accumulate_dinp ? 1.0f : 0.0f,
                dx, C);
  // dw[OC,C] += dout^T @ inp (beta 0 overwrites: the same bits as accumulating onto zeros)
  if (dwt)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dy, OC, x, C, accumulate_dw ? 1.0f : 0.0f, dwt,
                C);

  if (db) {
    // Column sums: each thread owns a strip of columns and walks all rows, so the sums need no reduction and
    // the adds happen in row order (deterministic for any thread count).
    constexpr int kStrip = 256;
    const int strips = (OC + kStrip - 1) / kStrip;
#pragma omp parallel for if (int64_t{N} * OC > kParallelMin) schedule(static)
    for (int s = 0; s < strips; ++s) {
      const int j0 = s * kStrip, nj = std::min(kStrip, OC - j0);
      float acc[kStrip] = {};
      for (int n = 0; n < N; ++n) {
        const float* row = dy + static_cast<size_t>(n) * OC + j0;
#pragma omp simd
        for (int j = 0; j < nj; ++j) acc[j] += row[j];
      }
      for (int j = 0; j < nj; ++j) db[j0 + j] = accumulate_dw ? db[j0 + j] + acc[j] : acc[j];
    }
  }
}

}  // namespace mt
