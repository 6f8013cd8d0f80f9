// cuBLASLt GEMMs for the linear layers: bf16 A and B, fp32 compute and scale, bf16 or fp32 C = D, optional fused
// epilogue (bias, GELU with its input saved, GELU gradient, bias gradient). Matrices here are COLUMN-major, as
// cuBLASLt sees them; matmul.cpp maps the row-major tensors onto this (see the comment there).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>

namespace mt {

struct LtCall {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;  // D[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * D
  const void* A = nullptr;      // bf16, stored [m, k] (N) or [k, m] (T), leading dimension lda
  int64_t lda = 0;
  const void* B = nullptr;      // bf16, stored [k, n] (N) or [n, k] (T)
  int64_t ldb = 0;
  void* D = nullptr;            // C and D are the same matrix unless C is set
  int64_t ldd = 0;
  const void* C = nullptr;      // with beta != 0: the matrix added, when it is not D (same type and layout as D)
  cudaDataType_t d_type = CUDA_R_16BF;  // CUDA_R_16BF or CUDA_R_32F
  float beta = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;   // bf16 [m] (BIAS epilogues)
  void* bias_out = nullptr;     // [n], D's type: the BGRADB epilogue writes the sums of op(B) over k here
  void* aux = nullptr;          // bf16 [m, n] with leading dimension aux_ld (GELU_AUX / DGELU epilogues)
  int64_t aux_ld = 0;
};

class LtGemm {
 public:
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  LtGemm();  // the handle and the workspace, on the current device
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Runs the GEMM on `stream`. Returns false, launching nothing, when cuBLASLt has no algorithm for this
  // combination (e.g. an epilogue it does not support for these types or alignments): the caller falls back to
  // unfused kernels. Any other failure throws naming `op` and the cuBLASLt call.
  bool run(cudaStream_t stream, const LtCall& c, const char* op);

 private:
  using Key = std::array<int64_t, 19>;
  struct Found {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Found> algos_;  // heuristic results by everything they depend on (shapes, types, alignments)
};

}  // namespace mt
