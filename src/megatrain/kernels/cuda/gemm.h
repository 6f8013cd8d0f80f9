// cuBLASLt GEMMs for the linear layers: bf16 A and B, fp32 compute and scale, bf16 or fp32 C = D, optional fused
// epilogue (bias, GELU with its input saved, GELU gradient, bias gradient). Matrices here are COLUMN-major, as
// cuBLASLt sees them; matmul.cpp maps the row-major tensors onto this (see the comment there).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mt {

struct LtCall {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;  // D[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * D
  const void* A = nullptr;      // bf16, stored [m, k] (N) or [k, m] (T), leading dimension lda
  int64_t lda = 0;
  const void* B = nullptr;  // bf16, stored [k, n] (N) or [n, k] (T)
  int64_t ldb = 0;
  void* D = nullptr;  // C and D are the same matrix unless C is set
  int64_t ldd = 0;
  const void* C = nullptr;  // with beta != 0: the matrix added, when it is not D (same type and layout as D)
  cudaDataType_t d_type = CUDA_R_16BF;  // CUDA_R_16BF or CUDA_R_32F
  float beta = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // bf16 [m] (BIAS epilogues)
  void* bias_out = nullptr;    // [n], D's type: the BGRADB epilogue writes the sums of op(B) over k here
  void* aux = nullptr;         // bf16 [m, n] with leading dimension aux_ld (GELU_AUX / DGELU epilogues)
  int64_t aux_ld = 0;
};

// Whether running `c` several times leaves what running it once leaves: nothing it writes (D, the GELU_AUX
// epilogues' aux, the BGRAD epilogues' bias_out) overlaps anything it reads (A, B, the bias, the DGELU epilogues'
// aux, and C, which is D itself when C is unset and beta != 0). Only such calls are timed by GEMM tuning: timing an
// accumulation (dw += ..., out = ... + out) would add it as many times as it was timed.
bool gemm_reruns_safely(const LtCall& c);

// What GEMM tuning found for one distinct problem (LtGemm::tuning()).
struct GemmTuned {
  std::string problem;  // "m x n x k, op(A) op(B), epilogue, D type, beta"
  std::string op;       // the op that first ran it
  int candidates = 0;   // algorithms the heuristic offered (and were timed, when tuned)
  int chosen = 0;       // index of the fastest in the heuristic's order (0: the heuristic was right)
  bool tuned = false;   // false: not timed (why_not says why), the heuristic's first runs
  std::string why_not;
  double heuristic_ms = 0;  // the heuristic's first choice, median of the timed runs
  double best_ms = 0;       // the chosen one
  int64_t calls = 0;        // runs of this problem since the handle was made
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

  // GEMM tuning: with candidates > 0, the first run of each distinct problem asks cuBLASLt's heuristic for up to
  // `candidates` algorithms, times each on the call's own operands (a median of a few runs, the stream waited on),
  // and keeps the fastest for the rest of the process. Why: the heuristic's first choice is a prediction, right
  // most of the time but not for every shape and epilogue; one timed pass per problem (N x 8 runs of it, once
  // per process) settles it. Calls that do not rerun safely (gemm_reruns_safely) and calls made while
  // the stream is being captured keep the heuristic's choice. The choice depends on timings, so two tuned
  // processes may choose differently and round differently: off (0) by default, where every process runs the same
  // algorithms.
  void set_tuning(int candidates) { tuning_ = candidates; }
  int tuning() const { return tuning_; }
  std::vector<GemmTuned> tuned() const;

 private:
  using Key = std::array<int64_t, 19>;
  struct Found {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
    GemmTuned report;
  };
  // Times the heuristic's candidates, each run through `matmul` (c on its own operands, the one cuBLASLt call run()
  // also makes), and puts the fastest in f (or says in f.report why not).
  void tune(cudaStream_t stream, const LtCall& c,
            const std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>& matmul,
            const std::vector<cublasLtMatmulHeuristicResult_t>& results, Found& f);
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Found> algos_;  // heuristic results by everything they depend on (shapes, types, alignments)
  int tuning_ = 0;
};

}  // namespace mt
