// What this process's BLAS is and can run: the OpenBLAS core in use, the CPU's instruction sets, a numerical
// self-test of the kernels loaded, and the line the run's first line carries. The decision they feed is
// blas_core_choice.h; the processes that apply it are launch/blas_core.h and cli/.
#pragma once
#include <functional>
#include <string>

#include "megatrain/kernels/cpu/blas_core_choice.h"

namespace mt {

// openblas_get_corename(): the kernels this process runs, e.g. "SkylakeX" (fixed when OpenBLAS loaded).
std::string blas_core_name();

// This CPU's instruction sets as the OS enables them (all false off x86-64).
CpuFeatures cpu_features();

// sgemm of this process's kernels against a naive double GEMM: every transpose pair, alpha and beta not 1 and 0,
// sizes that are not multiples of any kernel's block (and ones above the blocks), leading dimensions wider than the
// matrices. An element passes within 4 k eps sum_l |a_il b_lj| (+ the beta term) of the naive one, a bound correct
// kernels meet in any summation order. False, with what was wrong in `why`, when an element misses it.
bool blas_self_test(std::string* why);
// The same check of any row-major sgemm (C = alpha op(A) op(B) + beta C), so the check itself can be tested.
using SgemmFn = std::function<void(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                                   const float* b, int ldb, float beta, float* c, int ldc)>;
bool sgemm_self_test(const SgemmFn& sgemm, std::string* why);

// The run's first line's BLAS part: "BLAS core SkylakeX (<why>)": the core in use, and why, from kBlasCoreNoteEnv
// when it names the OPENBLAS_CORETYPE in effect, else from OPENBLAS_CORETYPE (the user's) or "OpenBLAS's choice".
std::string blas_core_summary();

}  // namespace mt
