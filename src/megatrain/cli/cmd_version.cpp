// megatrain version (also megatrain --version): what a bug report needs to say which megatrain ran: its version,
// the git commit it was built from, the build type and compiler, the BLAS, and where built, CUDA, cuBLASLt, cuDNN and
// NCCL. Needs no GPU and reads no config.
#include <fmt/format.h>

#include <string>

#include "megatrain/cli/commands.h"
#include "megatrain/comm/nccl_version.h"
#include "megatrain/core/error.h"
#include "megatrain/kernels/ops.h"

namespace mt {
std::string build_commit();  // generated at build time (cmake/build_commit.cmake)
}  // namespace mt

namespace mt::cli {

int cmd_version(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print("usage: megatrain version   (or megatrain --version)\n\n"
                 "Prints megatrain's version, the git commit it was built from, the build type and compiler, the\n"
                 "BLAS, and the CUDA, cuBLASLt, cuDNN and NCCL versions where the CUDA backend is built.\n");
      return 0;
    }
    fail("unexpected argument '{}' (megatrain version takes none)", a);
  }
  fmt::print("megatrain {}\n", MT_VERSION);
  fmt::print("commit:   {}\n", build_commit());
  fmt::print("build:    {}, {}\n", MT_BUILD_TYPE, MT_CXX);
  fmt::print("BLAS:     {}\n", blas_version());
  fmt::print("CUDA:     {}\n", cuda_versions());
  fmt::print("NCCL:     {}\n", nccl_version());
  return 0;
}

}  // namespace mt::cli
