// cuBLASLt is loaded on first use (kernels/cuda/cublaslt_api.h), not at process start: its static initialisers
// cost ~0.35 s of every start, GPU or not. Needs the CUDA toolkit's libraries, not a device: label `unit`.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "megatrain/kernels/cuda/cublaslt_api.h"
#include "megatrain/kernels/ops.h"

namespace {

// Whether a library whose file name contains `name` is mapped into this process (the kernel's own list).
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

// Declared first: in a run of the whole binary it must see the process before anything called lt().
TEST(CublasLtLoader, AProcessThatMakesNoGemmNeverMapsTheLibrary) {
  // This binary links the CUDA backend (the check below would fail to link otherwise) and asks what a CPU
  // run asks of it.
  (void)mt::cuda_available();
  EXPECT_FALSE(mapped("libcublasLt")) << "libcublasLt is mapped before any GEMM handle was made";
  EXPECT_TRUE(mapped("libcudart")) << "the test no longer sees the linked CUDA runtime, so it proves nothing";
}

TEST(CublasLtLoader, LoadsOnFirstUseAndResolvesEveryEntryPoint) {
  const mt::LtApi& api = mt::lt();  // throws, naming what it tried, if the library is missing
  EXPECT_FALSE(api.path.empty());
  EXPECT_TRUE(mapped("libcublasLt"));
  // A call into the loaded library that needs no device, against the name the cuBLAS documentation gives.
  EXPECT_STREQ(api.GetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(api.GetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  for (const void* f : {(const void*)api.Create, (const void*)api.Destroy, (const void*)api.Matmul,
                        (const void*)api.MatmulAlgoGetHeuristic, (const void*)api.MatmulDescCreate,
                        (const void*)api.MatmulDescDestroy, (const void*)api.MatmulDescSetAttribute,
                        (const void*)api.MatmulPreferenceCreate, (const void*)api.MatmulPreferenceDestroy,
                        (const void*)api.MatmulPreferenceSetAttribute, (const void*)api.MatrixLayoutCreate,
                        (const void*)api.MatrixLayoutDestroy})
    EXPECT_NE(f, nullptr);
  EXPECT_EQ(&mt::lt(), &api) << "a second call must not load again";
}
