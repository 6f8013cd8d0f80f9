#include "megatrain/train/gpu_groups.h"

#include "megatrain/comm/cuda/nccl_group.h"
#include "megatrain/comm/cuda/staged_cuda.h"
#include "megatrain/kernels/cuda/cuda_ops.h"

namespace mt {

namespace {
cudaStream_t stream_of(Ops& ops) {
  auto* cuda = dynamic_cast<CudaOps*>(&ops);
  MT_CHECK(cuda != nullptr, "NCCL groups need the CUDA backend (train.device = \"cuda\"), not the {} backend",
           ops.device() == Device::CPU ? "CPU" : "given");
  return cuda->stream();
}
}  // namespace

GroupFactory gpu_mesh_groups(Ops& ops) { return nccl_mesh_groups(stream_of(ops)); }

GroupFactory gpu_staged_mesh_groups(Ops& ops) { return staged_mesh_groups(stream_of(ops)); }

}  // namespace mt
