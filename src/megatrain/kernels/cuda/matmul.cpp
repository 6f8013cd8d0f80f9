// Linear layers on cuBLASLt (bf16 in, fp32 accumulate), with the bias and GeLU fused into the GEMM epilogue.
//
// Row-major tensors, column-major cuBLASLt. A row-major [R, S] matrix with row stride S is, byte for byte, a
// column-major [S, R] matrix with leading dimension S (its transpose). So every row-major product is computed as
// its transpose, which swaps the operands:
//   forward   out[N,OC] = inp[N,C] @ w[OC,C]^T   <=>  out^T[OC,N] = (w^T)^T[OC,C] @ inp^T[C,N]
//             A = w seen as [C,OC] (ld C) with op T, B = inp seen as [C,N] (ld C), D = out seen as [OC,N] (ld OC);
//             m = OC, n = N, k = C. The bias is a per-row vector of D (length m = OC): the BIAS epilogue broadcasts
//             it along n, exactly out[n, :] += bias.
//   dinp      dinp[N,C] = dout[N,OC] @ w[OC,C]   <=>  dinp^T[C,N] = w^T[C,OC] @ dout^T[OC,N]
//             A = w seen as [C,OC] (ld C), B = dout seen as [OC,N] (ld OC), D = dinp seen as [C,N] (ld C);
//             m = C, n = N, k = OC.
//   dw        dw[OC,C] += dout^T @ inp[N,C]       <=>  dw^T[C,OC] += inp^T[C,N] @ dout[N,OC]
//             A = inp seen as [C,N] (ld C), B = dout seen as [OC,N] (ld OC) with op T, D = dw seen as [C,OC]
//             (ld C) in fp32 with beta = 1 (gradients accumulate across micro-batches in fp32);
//             m = C, n = OC, k = N.
// The GeLU epilogues keep their auxiliary matrix (the GeLU input `pre`, row-major [N, width]) in the same
// transposed view as D, leading dimension = the row width, which cuBLASLt requires to be a multiple of 8: other
// widths take the unfused path (GEMM, then the elementwise kernel).
// dbias, the column sums of dout, comes out of the dw GEMM: dout is its B operand, and the BGRADB epilogue sums B
// over k = N into a vector of n = OC, which is the bias gradient. The GEMM reads dout anyway, so this saves a pass
// over it: on the H100 the separate column-sum kernels took 3.8 ms of the 1.3B model's 140 ms step
// (bench/results/ncu_kernels-gpt-1.3b-nvidia-h100-80gb-hbm3.json). The epilogue writes its vector, so accumulating
// (a second micro-batch) goes through the scratch and an add; where cuBLASLt refuses the epilogue, the column-sum
// kernels (deterministic, accumulating) run instead.
// A linear joining the residual stream reads the residual as the GEMM's C matrix (beta = 1, C distinct from D or D
// itself): out^T = w^T^T @ inp^T + residual^T (+ bias), one pass over the output instead of a GEMM and an add.
#include "megatrain/kernels/cuda/cuda_args.h"
#include "megatrain/kernels/cuda/cuda_ops.h"
#include "megatrain/kernels/cuda/launch.h"
#include "megatrain/kernels/cuda/linear_calls.h"

namespace mt {

using namespace cuda_args;
using cuda::bf16;

namespace {

// The sizes of a linear layer (op_shapes.h); cuBLASLt also needs C > 0 and 32-bit dimensions.
LinearDims linear_dims(const char* op, const Tensor& inp, const Tensor& w) {
  LinearDims d = weight_dims(op, w);
  MT_CHECK(d.C > 0, "{}: weight {} has no input channels", op, w.shape_str());
  d.N = linear_rows(op, inp, w, d.C);
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  MT_CHECK(d.N <= kMax && d.C <= kMax && d.OC <= kMax, "{}: dimensions too large for one GEMM", op);
  return d;
}

// The checked arguments of a forward linear: out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias[OC]), all bf16.
struct ForwardArgs {
  bf16* out;
  const bf16 *inp, *w, *bias;
  LinearDims d;
};
ForwardArgs forward_args(const char* op, Tensor out, Tensor inp, Tensor w, Tensor bias) {
  ForwardArgs a{bf16_arg(out, op, "out"), bf16_arg(inp, op, "inp"), bf16_arg(w, op, "w"), bf16_opt(bias, op, "bias"),
                linear_dims(op, inp, w)};
  check_numel(out, a.d.N * a.d.OC, op, "out");
  if (a.bias) check_numel(bias, a.d.OC, op, "bias");
  return a;
}

[[noreturn]] void no_algo(const char* op, const char* what, const LinearDims& d) {
  fail("{}: cuBLASLt found no algorithm for the {} GEMM (N = {}, C = {}, OC = {})", op, what, d.N, d.C, d.OC);
}

}  // namespace

void CudaOps::matmul_forward(Tensor out, Tensor inp, Tensor w, Tensor bias) {
  const char* op = "matmul_forward";
  auto scope = timed(op);
  const ForwardArgs a = forward_args(op, out, inp, w, bias);
  const LinearDims& d = a.d;
  const bf16* b = a.bias;
  if (d.N == 0 || d.OC == 0) return;
  LtCall c = forward_call(a.out, a.inp, a.w, d);
  if (b) {
    c.epilogue = CUBLASLT_EPILOGUE_BIAS;
    c.bias = b;
  }
  if (!gemm_->run(stream_, c, op)) no_algo(op, "forward", d);
}

void CudaOps::matmul_forward_add(Tensor out, Tensor inp, Tensor w, Tensor bias, Tensor residual, Tensor tmp) {
  const char* op = "matmul_forward_add";
  {
    auto scope = timed(op);  // the fallback below times its own two ops
    if (fused_forward_add(op, out, inp, w, bias, residual)) return;
  }
  // No algorithm for the fused form (or nothing to multiply): the product into tmp, then the add.
  Ops::matmul_forward_add(out, inp, w, bias, residual, tmp);
}

bool CudaOps::fused_forward_add(const char* op, Tensor out, Tensor inp, Tensor w, Tensor bias, Tensor residual) {
  const ForwardArgs a = forward_args(op, out, inp, w, bias);
  const bf16* r = bf16_arg(residual, op, "residual");
  check_numel(residual, a.d.N * a.d.OC, op, "residual");
  if (a.d.N == 0) return true;
  if (a.d.OC == 0) return false;
  LtCall c = forward_call(a.out, a.inp, a.w, a.d);
  c.C = r;
  c.beta = 1.0f;
  if (a.bias) {
    c.epilogue = CUBLASLT_EPILOGUE_BIAS;
    c.bias = a.bias;
  }
  return gemm_->run(stream_, c, op);
}

void CudaOps::matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor w, Tensor bias) {
  const char* op = "matmul_gelu_forward";
  auto scope = timed(op);
  const ForwardArgs a = forward_args(op, out, inp, w, bias);
  bf16* o = a.out;
  bf16* p = bf16_arg(pre, op, "pre");
  const bf16 *x = a.inp, *wt = a.w, *b = a.bias;
  const LinearDims& d = a.d;
  check_numel(pre, d.N * d.OC, op, "pre");
  if (d.N == 0 || d.OC == 0) return;
  // Fused: out = gelu(inp @ w^T + bias) with pre = inp @ w^T + bias saved as the epilogue's auxiliary output.
  LtCall c = forward_call(o, x, wt, d);
  c.epilogue = b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  c.bias = b;
  c.aux = p;
  c.aux_ld = d.OC;
  if (d.OC % 8 == 0 && gemm_->run(stream_, c, op)) return;
  // Unfused: pre = GEMM + bias, then out = gelu(pre).
  LtCall plain = forward_call(p, x, wt, d);
  if (b) {
    plain.epilogue = CUBLASLT_EPILOGUE_BIAS;
    plain.bias = b;
  }
  if (!gemm_->run(stream_, plain, op)) no_algo(op, "forward", d);
  cuda::gelu_forward(stream_, o, p, d.N * d.OC);
}

void CudaOps::weight_grads(const char* op, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, int64_t N, int64_t C,
                           int64_t OC, bool accumulate) {
  // Checked before anything of the op is launched (the callers check dinp / dpre themselves).
  float* dwt = f32_opt(dw, op, "dw");
  float* db = f32_opt(dbias, op, "dbias");
  const bf16* x = dwt ? bf16_arg(inp, op, "inp") : nullptr;
  if (dwt) {
    check_numel(inp, N * C, op, "inp");
    check_numel(dw, OC * C, op, "dw");
  }
  if (db) {
    check_numel(dbias, OC, op, "dbias");
    MT_CHECK(static_cast<size_t>(OC) <= scratch_floats_, "{}: OC = {} exceeds the column-sum scratch", op, OC);
  }
  if (N == 0) {  // sums over no rows: nothing to add, or zeros to write
    if (!accumulate && dwt) cuda::check(cudaMemsetAsync(dwt, 0, dw.nbytes(), stream_), "weight_grads: memset dw");
    if (!accumulate && db) cuda::check(cudaMemsetAsync(db, 0, dbias.nbytes(), stream_), "weight_grads: memset db");
    return;
  }
  const bf16* dy = static_cast<const bf16*>(dout.ptr);
  const LtCall c = dw_call(dwt, dy, x, {N, C, OC}, accumulate ? 1.0f : 0.0f);
  if (dwt && OC > 0) {
    if (db && fuse_bias_grads_ && dw_with_bias_grads(op, c, db, OC, accumulate)) return;
    if (!gemm_->run(stream_, c, op)) no_algo(op, "dw", {N, C, OC});
  }
  if (db) cuda::column_sums_accumulate(stream_, db, dy, N, OC, scratch_, scratch_floats_, accumulate);
}

bool CudaOps::dw_with_bias_grads(const char* op, LtCall dw, float* db, int64_t OC, bool accumulate) {
  dw.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  dw.bias_out = accumulate ? scratch_ : db;  // fp32, D's type; the caller checked OC <= scratch_floats_
  if (!gemm_->run(stream_, dw, op)) return false;
  if (accumulate) cuda::add_partial_rows(stream_, db, nullptr, OC, scratch_, OC, 1, true);  // db += scratch
  ++fused_bias_grads_;
  return true;
}

void CudaOps::matmul_backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, Tensor inp, Tensor w,
                              bool accumulate_dinp, bool accumulate_dw) {
  const char* op = "matmul_backward";
  auto scope = timed(op);
  bf16* dx = bf16_opt(dinp, op, "dinp");
  const bf16* dy = bf16_arg(dout, op, "dout");
  const bf16* wt = bf16_arg(w, op, "w");
  // Without dw the input is not needed (inp may be undefined): the row count then comes from dinp.
  MT_CHECK(inp.defined() || dx, "{}: needs inp or dinp (to know the row count)", op);
  if (dw.defined()) bf16_arg(inp, op, "inp");
  const LinearDims d = linear_dims(op, inp.defined() ? inp : dinp, w);
  check_numel(dout, d.N * d.OC, op, "dout");
  if (dx) check_numel(dinp, d.N * d.C, op, "dinp");
  if (d.N == 0) return weight_grads(op, dw, dbias, dout, inp, 0, d.C, d.OC, accumulate_dw);
  if (dx && d.OC == 0 && !accumulate_dinp) {  // an empty sum: dinp = 0
    cuda::check(cudaMemsetAsync(dx, 0, dinp.nbytes(), stream_), "matmul_backward: cudaMemsetAsync");
  } else if (dx && d.OC > 0) {
    // dw / dbias are validated first so that a bad argument launches nothing.
    f32_opt(dw, op, "dw");
    f32_opt(dbias, op, "dbias");
    if (dw.defined()) check_numel(dw, d.OC * d.C, op, "dw");
    if (dbias.defined()) check_numel(dbias, d.OC, op, "dbias");
    if (!gemm_->run(stream_, dinp_call(dx, dy, wt, d, accumulate_dinp ? 1.0f : 0.0f), op)) no_algo(op, "dinp", d);
  }
  weight_grads(op, dw, dbias, dout, inp, d.N, d.C, d.OC, accumulate_dw);
}

void CudaOps::matmul_backward_gelu(Tensor dpre, Tensor dw, Tensor dbias, Tensor dout, Tensor act, Tensor w, Tensor pre,
                                   bool accumulate_dw) {
  const char* op = "matmul_backward_gelu";
  auto scope = timed(op);
  bf16* dp = bf16_arg(dpre, op, "dpre");
  const bf16* dy = bf16_arg(dout, op, "dout");
  const bf16* wt = bf16_arg(w, op, "w");
  bf16* pr = bf16_arg(pre, op, "pre");
  const LinearDims d = linear_dims(op, dpre, w);
  check_numel(dout, d.N * d.OC, op, "dout");
  check_numel(pre, d.N * d.C, op, "pre");
  if (d.N == 0) return weight_grads(op, dw, dbias, dout, act, 0, d.C, d.OC, accumulate_dw);
  MT_CHECK(d.OC > 0, "{}: weight {} has no output channels", op, w.shape_str());
  f32_opt(dw, op, "dw");  // validated before the first launch
  f32_opt(dbias, op, "dbias");
  if (dw.defined()) {
    bf16_arg(act, op, "act");
    check_numel(act, d.N * d.C, op, "act");
    check_numel(dw, d.OC * d.C, op, "dw");
  }
  if (dbias.defined()) check_numel(dbias, d.OC, op, "dbias");
  // Fused: dpre = (dout @ w) * gelu'(pre), the DGELU epilogue reading pre as its auxiliary input.
  LtCall c = dinp_call(dp, dy, wt, d, 0.0f);
  c.epilogue = CUBLASLT_EPILOGUE_DGELU;
  c.aux = pr;
  c.aux_ld = d.C;
  if (!(d.C % 8 == 0 && gemm_->run(stream_, c, op))) {
    // Unfused: dpre = dout @ w, then dpre *= gelu'(pre) in place.
    if (!gemm_->run(stream_, dinp_call(dp, dy, wt, d, 0.0f), op)) no_algo(op, "dinp", d);
    cuda::gelu_backward(stream_, dp, pr, dp, d.N * d.C);
  }
  weight_grads(op, dw, dbias, dout, act, d.N, d.C, d.OC, accumulate_dw);
}

}  // namespace mt
