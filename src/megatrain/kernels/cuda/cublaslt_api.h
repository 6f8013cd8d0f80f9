// cuBLASLt, loaded when the first GEMM handle is made rather than when the process starts.
//
// Why: libcublasLt's static initialisers take about 0.35 s of CPU at every process start (measured with perf on
// `megatrain --version`: 43% of its samples in libcublasLt, most of the rest page faults it caused). Every megatrain
// process and every test binary paid that, GPU or not. A CPU job of 8 ranks paid it 8 times, and the test suite
// about a thousand times. Loaded with dlopen on first use, only a process that makes a CudaOps pays it.
//
// The table holds the 13 entry points gemm.cpp uses (and GetVersion, for `megatrain --version`), with the types of <cublasLt.h>, so calls read as before:
// `lt().Matmul(...)`. The library is looked for at the path CMake found at configure time, then by its soname (the
// dynamic loader's search: LD_LIBRARY_PATH, ld.so.cache).
#pragma once
#include <cublasLt.h>

#include <string>

namespace mt {

// The entry points, each named without its `cublasLt` prefix: one list for the table and for the loader.
// (laid out by hand)
// clang-format off
#define MT_CUBLASLT_ENTRY_POINTS(X)                                                                               \
  X(Create) X(Destroy) X(GetStatusName) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate)                 \
  X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)           \
  X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy) X(GetVersion)
// clang-format on

struct LtApi {
#define MT_CUBLASLT_FIELD(name) decltype(&cublasLt##name) name = nullptr;
  MT_CUBLASLT_ENTRY_POINTS(MT_CUBLASLT_FIELD)
#undef MT_CUBLASLT_FIELD
  std::string path;  // the file that was loaded
};

// The table, loading the library on the first call (thread-safe). When the library or one of the entry points is
// missing it throws ErrorKind::Config (an installation problem: restarting cannot help), naming every place it
// looked and the loader's reason.
const LtApi& lt();

}  // namespace mt
