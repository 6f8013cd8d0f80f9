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
#define MT_EXPECT_LOADED(name) EXPECT_NE(reinterpret_cast<const void*>(api.name), nullptr) << #name;
  MT_CUBLASLT_ENTRY_POINTS(MT_EXPECT_LOADED)
#undef MT_EXPECT_LOADED
  EXPECT_EQ(&mt::lt(), &api) << "a second call must not load again";
}
