// Without the CUDA backend in the build there is no NCCL (comm/cuda/ is not compiled).
#ifndef MT_HAVE_CUDA
#include "megatrain/comm/nccl_version.h"

namespace mt {

std::string nccl_version() { return "NCCL: not built with CUDA"; }

}  // namespace mt
#endif
