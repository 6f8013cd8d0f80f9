// cuBLASLt calls (through lt(): the library is loaded on first use, cublaslt_api.h says why): descriptors are cheap
// host objects, created per call; the algorithm choice (a heuristic query costing tens of microseconds, or with
// tuning a timed pass over the heuristic's candidates) is cached per distinct problem.
#include "megatrain/kernels/cuda/gemm.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/kernels/cuda/cublaslt_api.h"
#include "megatrain/kernels/cuda/launch.h"

namespace mt {

namespace {

void lt_check(cublasStatus_t st, const char* op, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    fail_as(ErrorKind::Device, "{}: {} failed: {} ({})", op, call, lt().GetStatusName(st), static_cast<int>(st));
}

// The largest power of two (up to 256) dividing the address: cuBLASLt algorithms state the alignment they need,
// and by default the heuristic assumes 256-byte aligned pointers, which a row slice of a tensor may not be.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

// Owns the descriptors of one call (destroyed on every path, including throws).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) lt().MatmulPreferenceDestroy(pref);
    if (d) lt().MatrixLayoutDestroy(d);
    if (b) lt().MatrixLayoutDestroy(b);
    if (a) lt().MatrixLayoutDestroy(a);
    if (op) lt().MatmulDescDestroy(op);
  }
};

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const char* op) {
  lt_check(lt().MatmulDescSetAttribute(d, attr, &v, sizeof(v)), op, "cublasLtMatmulDescSetAttribute");
}

template <class T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v, const char* op) {
  lt_check(lt().MatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)), op, "cublasLtMatmulPreferenceSetAttribute");
}

// A byte range [lo, hi) of device memory; empty when hi == lo.
struct Range {
  uintptr_t lo = 0, hi = 0;
};

// The bytes a column-major rows x cols matrix with leading dimension ld spans.
Range matrix(const void* p, int64_t rows, int64_t cols, int64_t ld, size_t elem) {
  if (!p || rows <= 0 || cols <= 0) return {};
  const auto lo = reinterpret_cast<uintptr_t>(p);
  return {lo, lo + static_cast<uintptr_t>(((cols - 1) * ld + rows) * static_cast<int64_t>(elem))};
}

Range vector_of(const void* p, int64_t n, size_t elem) { return matrix(p, n, 1, n, elem); }

bool overlap(Range a, Range b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

bool writes_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_GELU: return "gelu";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "gelu+bias";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "gelu_aux";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "gelu_aux+bias";
    case CUBLASLT_EPILOGUE_DGELU: return "dgelu";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "dgelu+bgrad";
    case CUBLASLT_EPILOGUE_BGRADA: return "bgrada";
    case CUBLASLT_EPILOGUE_BGRADB: return "bgradb";
    default: return "other";
  }
}

std::string problem_name(const LtCall& c) {
  return fmt::format("{} x {} x {}, {}{}, {}, D {}, beta {}", c.m, c.n, c.k, c.trans_a == CUBLAS_OP_T ? 'T' : 'N',
                     c.trans_b == CUBLAS_OP_T ? 'T' : 'N', epilogue_name(c.epilogue),
                     c.d_type == CUDA_R_32F ? "fp32" : "bf16", c.beta);
}

// Two CUDA events, destroyed on every path.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    cuda::check(cudaEventCreate(&start), "GEMM tuning: cudaEventCreate");
    cuda::check(cudaEventCreate(&stop), "GEMM tuning: cudaEventCreate");
  }
  ~EventPair() {
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
  }
};

}  // namespace

bool gemm_reruns_safely(const LtCall& c) {
  const size_t d_elem = c.d_type == CUDA_R_32F ? 4 : 2;
  const bool ta = c.trans_a == CUBLAS_OP_T, tb = c.trans_b == CUBLAS_OP_T;
  if (c.beta != 0.0f && (!c.C || c.C == c.D)) return false;  // D += ...: each run adds again
  const Range d = matrix(c.D, c.m, c.n, c.ldd, d_elem);
  std::vector<Range> writes{d};
  std::vector<Range> reads{matrix(c.A, ta ? c.k : c.m, ta ? c.m : c.k, c.lda, 2),
                           matrix(c.B, tb ? c.n : c.k, tb ? c.k : c.n, c.ldb, 2), vector_of(c.bias, c.m, 2)};
  if (c.beta != 0.0f) reads.push_back(matrix(c.C, c.m, c.n, c.ldd, d_elem));
  if (c.aux) (writes_aux(c.epilogue) ? writes : reads).push_back(matrix(c.aux, c.m, c.n, c.aux_ld, 2));
  if (c.bias_out) writes.push_back(vector_of(c.bias_out, c.epilogue == CUBLASLT_EPILOGUE_BGRADA ? c.m : c.n, d_elem));
  for (const Range& w : writes)
    for (const Range& r : reads)
      if (overlap(w, r)) return false;
  return true;
}

LtGemm::LtGemm() {
  lt_check(lt().Create(&handle_), "CudaOps", "cublasLtCreate");
  cuda::check(cudaMalloc(&workspace_, kWorkspaceBytes), "CudaOps: cudaMalloc(cuBLASLt workspace)");
}

LtGemm::~LtGemm() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) lt().Destroy(handle_);
}

bool LtGemm::run(cudaStream_t stream, const LtCall& c, const char* op) {
  Descs ds;
  lt_check(lt().MatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "cublasLtMatmulDescCreate");
  set_desc(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(c.trans_a), op);
  set_desc(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(c.trans_b), op);
  set_desc(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(c.epilogue), op);
  // The bias and aux types are left at their defaults, which are D's type (bf16 for the forward epilogues, fp32
  // for the bias gradient of the fp32 weight-gradient GEMM); setting them explicitly is documented to fail for
  // combinations that do not take the attribute.
  if (c.bias) set_desc(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias, op);
  if (c.bias_out) set_desc(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias_out, op);
  if (c.aux) {
    set_desc(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux, op);
    set_desc(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.aux_ld, op);
  }
  // Layouts describe the matrices as stored (before op()): rows x cols, column-major, leading dimension.
  const bool ta = c.trans_a == CUBLAS_OP_T, tb = c.trans_b == CUBLAS_OP_T;
  lt_check(lt().MatrixLayoutCreate(&ds.a, CUDA_R_16BF, ta ? c.k : c.m, ta ? c.m : c.k, c.lda), op,
           "cublasLtMatrixLayoutCreate(A)");
  lt_check(lt().MatrixLayoutCreate(&ds.b, CUDA_R_16BF, tb ? c.n : c.k, tb ? c.k : c.n, c.ldb), op,
           "cublasLtMatrixLayoutCreate(B)");
  lt_check(lt().MatrixLayoutCreate(&ds.d, c.d_type, c.m, c.n, c.ldd), op, "cublasLtMatrixLayoutCreate(D)");

  const void* C = c.C ? c.C : c.D;
  const uint32_t al_a = alignment(c.A), al_b = alignment(c.B), al_d = alignment(c.D);
  const uint32_t al_c = std::min(alignment(C), al_d);  // C and D share one layout and one alignment preference
  const Key key{c.trans_a,
                c.trans_b,
                c.m,
                c.n,
                c.k,
                c.lda,
                c.ldb,
                c.ldd,
                c.d_type,
                c.beta != 0.0f ? 1 : 0,
                c.epilogue,
                c.bias || c.bias_out,
                c.aux_ld,
                al_a,
                al_b,
                al_d,
                c.bias       ? alignment(c.bias)
                : c.bias_out ? alignment(c.bias_out)
                             : 0,
                c.aux ? alignment(c.aux) : 0,
                al_c};
  const float alpha = 1.0f, beta = c.beta;
  auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
    return lt().Matmul(handle_, ds.op, &alpha, c.A, ds.a, c.B, ds.b, &beta, C, ds.d, c.D, ds.d, &algo, workspace_,
                       kWorkspaceBytes, stream);
  };
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    lt_check(lt().MatmulPreferenceCreate(&ds.pref), op, "cublasLtMatmulPreferenceCreate");
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes), op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a, op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b, op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c, op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d, op);
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(1, tuning_)));
    int count = 0;
    const cublasStatus_t st = lt().MatmulAlgoGetHeuristic(handle_, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref,
                                                          static_cast<int>(results.size()), results.data(), &count);
    Found f;
    f.report.problem = problem_name(c);
    f.report.op = op;
    if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
      f.ok = true;
      f.algo = results[0].algo;
      f.report.candidates = count;
      results.resize(static_cast<size_t>(count));
      if (tuning_ > 0) tune(stream, c, matmul, results, f);
    } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !c.aux && !c.bias_out) {
      // A plain or bias GEMM must run: anything but "no algorithm" is an error. A GeLU or bias-gradient epilogue
      // that cuBLASLt rejects for any reason (types, alignment, leading dimension) is not: the caller runs the
      // unfused path.
      lt_check(st, op, "cublasLtMatmulAlgoGetHeuristic");
    }
    it = algos_.emplace(key, f).first;
  }
  if (!it->second.ok) return false;
  ++it->second.report.calls;

  lt_check(matmul(it->second.algo), op, "cublasLtMatmul");
  return true;
}

void LtGemm::tune(cudaStream_t stream, const LtCall& c,
                  const std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>& matmul,
                  const std::vector<cublasLtMatmulHeuristicResult_t>& results, Found& f) {
  GemmTuned& r = f.report;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda::check(cudaStreamIsCapturing(stream, &capture), "GEMM tuning: cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    r.why_not = "the stream is being captured";
    return;
  }
  if (!gemm_reruns_safely(c)) {
    r.why_not = "it writes what it reads (dw += ..., or an output over an input): each timed run would apply it again";
    return;
  }
  if (results.size() < 2) {
    r.why_not = "the heuristic offered one algorithm";
    return;
  }
  // Each candidate: one untimed run (its first launch may load the kernel), then kRuns runs timed one by one; the
  // candidates take turns, kRounds times over, so a clock that drifts (a GPU warming to its power limit) biases
  // none of them. A candidate's time is the median of its runs.
  constexpr int kRounds = 2, kRuns = 3;
  const size_t n = results.size();
  std::vector<std::vector<float>> ms(n);
  std::vector<bool> failed(n, false);
  EventPair ev;
  auto launch = [&](size_t i) { return matmul(results[i].algo); };
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < n; ++i) {
      if (failed[i]) continue;
      if (results[i].state != CUBLAS_STATUS_SUCCESS || launch(i) != CUBLAS_STATUS_SUCCESS) {
        failed[i] = true;  // an algorithm the library will not run here is not a candidate
        continue;
      }
      for (int k = 0; k < kRuns; ++k) {
        cuda::check(cudaEventRecord(ev.start, stream), "GEMM tuning: cudaEventRecord");
        const cublasStatus_t st = launch(i);
        cuda::check(cudaEventRecord(ev.stop, stream), "GEMM tuning: cudaEventRecord");
        cuda::check(cudaEventSynchronize(ev.stop), "GEMM tuning: cudaEventSynchronize");
        if (st != CUBLAS_STATUS_SUCCESS) {
          failed[i] = true;
          break;
        }
        float t = 0;
        cuda::check(cudaEventElapsedTime(&t, ev.start, ev.stop), "GEMM tuning: cudaEventElapsedTime");
        ms[i].push_back(t);
      }
    }
  }
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[v.size() / 2]);
  };
  if (failed[0]) {  // the heuristic's own choice failed to run: leave it to the normal path to report
    r.why_not = "the heuristic's first algorithm failed when timed";
    return;
  }
  size_t best = 0;
  std::vector<double> med(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (failed[i]) continue;
    med[i] = median(ms[i]);
    if (med[i] < med[best]) best = i;
  }
  r.tuned = true;
  r.chosen = static_cast<int>(best);
  r.heuristic_ms = med[0];
  r.best_ms = med[best];
  f.algo = results[best].algo;
}

std::vector<GemmTuned> LtGemm::tuned() const {
  std::vector<GemmTuned> out;
  out.reserve(algos_.size());
  for (const auto& [key, f] : algos_)
    if (f.ok) out.push_back(f.report);
  return out;
}

}  // namespace mt
