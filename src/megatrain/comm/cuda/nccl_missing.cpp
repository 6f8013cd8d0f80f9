// Stands in for nccl_group.cpp when CMake found no NCCL (cmake/gpu_libraries.cmake): the CUDA backend still builds
// and runs on one GPU without process groups, and asking for a GPU group says why there is none instead of failing
// to link or to configure.
#include "megatrain/comm/cuda/nccl_group.h"
#include "megatrain/comm/nccl_version.h"
#include "megatrain/comm/node_gpu_allreduce.h"
#include "megatrain/core/error.h"

namespace mt {

std::unique_ptr<ProcessGroup> make_nccl_group(Store&, const std::string& name, const std::vector<int>&, int,
                                              cudaStream_t, const GroupOptions&, const NcclOptions&) {
  fail_as(ErrorKind::Config,
          "GPU process group '{}': this megatrain was built without NCCL (CMake did not find libnccl and nccl.h); "
          "install NCCL or configure with -DMT_NCCL_ROOT=<folder> and rebuild",
          name);
}

std::string nccl_version() { return "NCCL: not found at build time"; }

NodeAllreduce node_gpu_allreduce(size_t) {
  NodeAllreduce out;
  out.why = "this megatrain was built without NCCL";
  return out;
}

GroupFactory nccl_mesh_groups(cudaStream_t compute_stream) {
  return [compute_stream](Store& store, GroupRole, const std::string& name, const std::vector<int>& ranks,
                          int my_global_rank, const GroupOptions& opt) {
    return make_nccl_group(store, name, ranks, my_global_rank, compute_stream, opt, {});
  };
}

}  // namespace mt
