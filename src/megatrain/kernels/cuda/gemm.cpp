// cuBLASLt calls (through lt(): the library is loaded on first use, cublaslt_api.h says why): descriptors are cheap
// host objects, created per call; the algorithm choice (a heuristic query costing tens of microseconds) is cached per
// distinct problem.
#include "megatrain/kernels/cuda/gemm.h"

#include <algorithm>

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

}  // namespace

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
  const Key key{c.trans_a, c.trans_b, c.m,    c.n,    c.k,    c.lda,  c.ldb,       c.ldd,
                c.d_type,  c.beta != 0.0f ? 1 : 0, c.epilogue, c.bias || c.bias_out, c.aux_ld, al_a, al_b, al_d,
                c.bias ? alignment(c.bias) : c.bias_out ? alignment(c.bias_out) : 0, c.aux ? alignment(c.aux) : 0,
                al_c};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    lt_check(lt().MatmulPreferenceCreate(&ds.pref), op, "cublasLtMatmulPreferenceCreate");
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes), op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a, op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b, op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c, op);
    set_pref(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d, op);
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t st =
        lt().MatmulAlgoGetHeuristic(handle_, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &result, &count);
    Found f;
    if (st == CUBLAS_STATUS_SUCCESS && count > 0) {
      f.ok = true;
      f.algo = result.algo;
    } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !c.aux && !c.bias_out) {
      // A plain or bias GEMM must run: anything but "no algorithm" is an error. A GeLU or bias-gradient epilogue
      // that cuBLASLt rejects for any reason (types, alignment, leading dimension) is not: the caller runs the
      // unfused path.
      lt_check(st, op, "cublasLtMatmulAlgoGetHeuristic");
    }
    it = algos_.emplace(key, f).first;
  }
  if (!it->second.ok) return false;

  const float alpha = 1.0f, beta = c.beta;
  lt_check(lt().Matmul(handle_, ds.op, &alpha, c.A, ds.a, c.B, ds.b, &beta, C, ds.d, c.D, ds.d,
                       &it->second.algo, workspace_, kWorkspaceBytes, stream),
           op, "cublasLtMatmul");
  return true;
}

}  // namespace mt
