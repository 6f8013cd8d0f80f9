// The groups a GPU run moves device memory over: NCCL groups ordered on the CUDA backend's compute stream (see
// dist/cuda/nccl_group.h). The glue between the backend (which owns the stream) and the NCCL groups lives here
// because only the trainer knows both. Host memory (norms, losses, checkpoints) keeps moving over Gloo groups.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "megatrain/dist/mesh.h"
#include "megatrain/dist/process_group.h"
#include "megatrain/dist/store.h"
#include "megatrain/kernels/ops.h"

namespace mt {

// A DeviceMesh factory of NCCL groups on ops's stream (p2p channels on the pp dimension). ops must be the CUDA
// backend; throws naming the problem otherwise or when this build has no CUDA.
GroupFactory gpu_mesh_groups(Ops& ops);

// One NCCL group of `ranks` on ops's stream (e.g. the tied-embedding group of the first and last stage).
std::unique_ptr<ProcessGroup> make_gpu_group(Ops& ops, Store& store, const std::string& name,
                                             const std::vector<int>& ranks, int my_global_rank,
                                             const GroupOptions& opt);

}  // namespace mt
