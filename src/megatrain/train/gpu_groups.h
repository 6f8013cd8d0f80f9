// The groups a GPU run moves device memory over: NCCL groups ordered on the CUDA backend's compute stream (see
// comm/cuda/nccl_group.h). The glue between the backend (which owns the stream) and the NCCL groups lives here
// because only the trainer knows both. Host memory (norms, losses, checkpoints) keeps moving over Gloo groups.
#pragma once
#include "megatrain/comm/mesh.h"
#include "megatrain/kernels/ops.h"

namespace mt {

// A DeviceMesh factory of NCCL groups on ops's stream (p2p channels on the pp dimension; also usable for groups
// outside the mesh, such as the tied-embedding group, under another dimension name). ops must be the CUDA backend;
// throws naming the problem otherwise or when this build has no CUDA.
GroupFactory gpu_mesh_groups(Ops& ops);

// The same with staged groups (comm/cuda/staged_cuda.h): Gloo groups over pinned host memory, ordered on ops's
// stream, for ranks that share a GPU (train/device_plane.h).
GroupFactory gpu_staged_mesh_groups(Ops& ops);

}  // namespace mt
