// The cuBLASLt calls of the grouped expert GEMMs (moe_grouped_gemm.cpp), built apart from their launch: pointer
// arithmetic on each expert's row block and weight slice over the linear layer's calls (linear_calls.h). Apart so
// that a test without a GPU can evaluate the calls and check where every expert reads and writes.
#pragma once
#include <cstdint>
#include <vector>

#include "megatrain/kernels/cuda/gemm.h"
#include "megatrain/kernels/op_shapes.h"

namespace mt {

struct ExpertGemm {
  int expert = 0;
  const char* what = "";  // "forward", "din" or "dw"
  LtCall call;
};

// moe_grouped_matmul_forward's GEMMs, in expert order, one per expert with rows: out[rows of e] (bf16 [A, O]) =
// in[rows of e] (bf16 [A, I]) @ w[e]^T (bf16 [E, O, I]).
std::vector<ExpertGemm> grouped_forward_gemms(void* out, const void* in, const void* w, const GroupedDims& g,
                                              const std::vector<int64_t>& offsets);
// moe_grouped_matmul_backward's, in expert order, per expert with rows: din[rows of e] = dout[rows of e] @ w[e]
// (when din is set; bf16, overwritten), then dw[e] (fp32 [E, O, I]) += dout[rows]^T @ in[rows] (overwritten
// without accumulate_dw). The zeroing of the experts without rows is not a GEMM and not here.
std::vector<ExpertGemm> grouped_backward_gemms(void* din, float* dw, const void* dout, const void* in, const void* w,
                                               const GroupedDims& g, const std::vector<int64_t>& offsets,
                                               bool accumulate_dw);

}  // namespace mt
