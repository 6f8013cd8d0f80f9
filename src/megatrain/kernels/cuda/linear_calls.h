// The three GEMMs of a linear layer as cuBLASLt calls (row-major tensors mapped onto column-major cuBLASLt: the
// comment at the top of matmul.cpp derives them), shared by the linear ops (matmul.cpp) and the grouped expert GEMMs
// (moe_grouped_gemm.cpp), which run the same products on one expert's rows at a time.
#pragma once
#include "megatrain/kernels/cuda/gemm.h"
#include "megatrain/kernels/op_shapes.h"

namespace mt {

// out^T[OC,N] = w^T^T @ inp^T.
inline LtCall forward_call(void* out, const void* inp, const void* w, const LinearDims& d) {
  LtCall c;
  c.trans_a = CUBLAS_OP_T;
  c.trans_b = CUBLAS_OP_N;
  c.m = d.OC, c.n = d.N, c.k = d.C;
  c.A = w, c.lda = d.C;
  c.B = inp, c.ldb = d.C;
  c.D = out, c.ldd = d.OC, c.d_type = CUDA_R_16BF;
  return c;
}

// dinp^T[C,N] = w^T[C,OC] @ dout^T[OC,N].
inline LtCall dinp_call(void* dinp, const void* dout, const void* w, const LinearDims& d, float beta) {
  LtCall c;
  c.trans_a = CUBLAS_OP_N;
  c.trans_b = CUBLAS_OP_N;
  c.m = d.C, c.n = d.N, c.k = d.OC;
  c.A = w, c.lda = d.C;
  c.B = dout, c.ldb = d.OC;
  c.D = dinp, c.ldd = d.C, c.d_type = CUDA_R_16BF;
  c.beta = beta;
  return c;
}

// dw^T[C,OC] += inp^T[C,N] @ dout[N,OC], fp32 D (beta 0: overwritten, the first write of a step's gradients).
inline LtCall dw_call(float* dw, const void* dout, const void* inp, const LinearDims& d, float beta) {
  LtCall c;
  c.trans_a = CUBLAS_OP_N;
  c.trans_b = CUBLAS_OP_T;
  c.m = d.C, c.n = d.OC, c.k = d.N;
  c.A = inp, c.lda = d.C;
  c.B = dout, c.ldb = d.OC;
  c.D = dw, c.ldd = d.C, c.d_type = CUDA_R_32F;
  c.beta = beta;
  return c;
}

}  // namespace mt
