// Without the CUDA backend in the build, asking for NCCL groups fails with a message saying why.
#ifndef MT_HAVE_CUDA
#include "megatrain/train/gpu_groups.h"

namespace mt {

namespace {
[[noreturn]] void no_cuda() {
  fail("this megatrain was built without CUDA (nvcc was not found at configure time): no NCCL groups; rebuild with "
       "/usr/local/cuda present or set train.device = \"cpu\"");
}
}  // namespace

GroupFactory gpu_mesh_groups(Ops&) { no_cuda(); }

GroupFactory gpu_staged_mesh_groups(Ops&) { no_cuda(); }

}  // namespace mt
#endif
