// Without the CUDA backend in the build there is no NCCL (comm/cuda/ is not compiled): its version and the node
// GPUs' all-reduce (node_gpu_allreduce.h) say so.
#ifndef MT_HAVE_CUDA
#include "megatrain/comm/nccl_version.h"
#include "megatrain/comm/node_gpu_allreduce.h"

namespace mt {

std::string nccl_version() { return "NCCL: not built with CUDA"; }

NodeAllreduce node_gpu_allreduce(size_t) {
  NodeAllreduce out;
  out.why = "this megatrain was built without CUDA";
  return out;
}

}  // namespace mt
#endif
