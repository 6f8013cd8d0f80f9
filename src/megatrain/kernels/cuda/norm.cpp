// LayerNorm / RMSNorm ops (kernels in norm_kernels.cu): bf16 rows, weights and outputs; fp32 mean/rstd and dw/db.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

using namespace cuda_args;

void CudaOps::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor w, Tensor b, float eps) {
  const char* op = "layernorm_forward";
  auto scope = timed(op);
  cuda::NormForwardArgs a;
  a.out = bf16_arg(out, op, "out");
  a.mean = f32_opt(mean, op, "mean");
  a.rstd = f32_opt(rstd, op, "rstd");
  a.inp = bf16_arg(inp, op, "inp");
  a.w = bf16_arg(w, op, "w");
  a.b = bf16_opt(b, op, "b");
  const auto [N, C] = layernorm_dims(op, out, mean, rstd, inp, w, b);
  a.N = N, a.C = C, a.eps = eps, a.rms = false;
  cuda::norm_forward(stream_, a);
}

void CudaOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor w, float eps) {
  const char* op = "rmsnorm_forward";
  auto scope = timed(op);
  cuda::NormForwardArgs a;
  a.out = bf16_arg(out, op, "out");
  a.rstd = f32_opt(rstd, op, "rstd");
  a.inp = bf16_arg(inp, op, "inp");
  a.w = bf16_arg(w, op, "w");
  const auto [N, C] = rmsnorm_dims(op, out, rstd, inp, w);
  a.N = N, a.C = C, a.eps = eps, a.rms = true;
  cuda::norm_forward(stream_, a);
}

void CudaOps::add_layernorm_forward(Tensor res, Tensor out, Tensor mean, Tensor rstd, Tensor a_t, Tensor b_t, Tensor w,
                                    Tensor bias, float eps, bool rms) {
  const char* op = rms ? "add_rmsnorm_forward" : "add_layernorm_forward";
  auto scope = timed(op);
  cuda::NormForwardArgs a;
  a.res = bf16_arg(res, op, "res");
  a.out = bf16_arg(out, op, "out");
  a.mean = rms ? nullptr : f32_opt(mean, op, "mean");
  a.rstd = f32_opt(rstd, op, "rstd");
  a.inp = bf16_arg(a_t, op, "a");
  a.add_b = bf16_arg(b_t, op, "b");
  a.w = bf16_arg(w, op, "w");
  a.b = rms ? nullptr : bf16_opt(bias, op, "bias");
  const auto [N, C] = norm_dims(op, a_t, w);
  check_numel(b_t, N * C, op, "b");
  check_numel(res, N * C, op, "res");
  check_numel(out, N * C, op, "out");
  if (a.mean) check_numel(mean, N, op, "mean");
  if (a.rstd) check_numel(rstd, N, op, "rstd");
  if (a.b) check_numel(bias, C, op, "bias");
  a.N = N, a.C = C, a.eps = eps, a.rms = rms;
  cuda::norm_forward(stream_, a);
}

void CudaOps::layernorm_backward(Tensor dinp, Tensor dw, Tensor db, Tensor dout, Tensor inp, Tensor w, Tensor mean,
                                 Tensor rstd, bool accumulate_dw) {
  const char* op = "layernorm_backward";
  auto scope = timed(op);
  cuda::NormBackwardArgs a;
  a.dinp = bf16_arg(dinp, op, "dinp");
  a.dw = f32_arg(dw, op, "dw");
  a.db = f32_opt(db, op, "db");
  a.dout = bf16_arg(dout, op, "dout");
  a.inp = bf16_arg(inp, op, "inp");
  a.w = bf16_arg(w, op, "w");
  a.mean = f32_arg(mean, op, "mean");
  a.rstd = f32_arg(rstd, op, "rstd");
  const auto [N, C] = layernorm_backward_dims(op, dinp, dw, db, dout, inp, w, mean, rstd);
  MT_CHECK(static_cast<size_t>(2 * C) <= scratch_floats_, "{}: C = {} exceeds the reduction scratch", op, C);
  a.N = N, a.C = C, a.rms = false, a.accumulate_dw = accumulate_dw;
  run_norm_backward(a);
}

void CudaOps::rmsnorm_backward(Tensor dinp, Tensor dw, Tensor dout, Tensor inp, Tensor w, Tensor rstd,
                               bool accumulate_dw) {
  const char* op = "rmsnorm_backward";
  auto scope = timed(op);
  cuda::NormBackwardArgs a;
  a.dinp = bf16_arg(dinp, op, "dinp");
  a.dw = f32_arg(dw, op, "dw");
  a.dout = bf16_arg(dout, op, "dout");
  a.inp = bf16_arg(inp, op, "inp");
  a.w = bf16_arg(w, op, "w");
  a.rstd = f32_arg(rstd, op, "rstd");
  const auto [N, C] = rmsnorm_backward_dims(op, dinp, dw, dout, inp, w, rstd);
  MT_CHECK(static_cast<size_t>(C) <= scratch_floats_, "{}: C = {} exceeds the reduction scratch", op, C);
  a.N = N, a.C = C, a.rms = true, a.accumulate_dw = accumulate_dw;
  run_norm_backward(a);
}

void CudaOps::run_norm_backward(cuda::NormBackwardArgs& a) {
  if (a.N == 0) {  // sums over no rows: nothing to add, or zeros to write
    if (a.accumulate_dw) return;
    cuda::check(cudaMemsetAsync(a.dw, 0, a.C * sizeof(float), stream_), "norm backward: cudaMemsetAsync");
    if (a.db && !a.rms)
      cuda::check(cudaMemsetAsync(a.db, 0, a.C * sizeof(float), stream_), "norm backward: cudaMemsetAsync");
    return;
  }
  a.scratch = scratch_, a.scratch_floats = scratch_floats_;
  cuda::norm_backward(stream_, a);
}

}  // namespace mt
