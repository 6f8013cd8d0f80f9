// The CUDA side of the staged device plane (comm/staged_group.h), for ranks that share a GPU: a mark is an event
// recorded on the compute stream; a copy runs on a copy stream of its own (one per concurrent copy, from a pool)
// through pinned host buffers (from a pool too: cudaMallocHost costs milliseconds) and blocks only the staging
// thread that asked for it. BF16 tensors are widened to F32 on the host, and rounded back to nearest even.
// Every call first makes the device the group was created on current: the group's threads are its own, and a
// thread's current device starts as device 0.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "megatrain/comm/mesh.h"
#include "megatrain/comm/staged_group.h"

namespace mt {

// The staging device of the current CUDA device, ordered after compute_stream (which must outlive it).
std::shared_ptr<StagingDevice> cuda_staging_device(cudaStream_t compute_stream);

// The DeviceMesh factory of staged groups on compute_stream: a Gloo group over host memory (a local group for a
// dimension of size 1), wrapped to take device tensors. One staging device serves every group of the factory.
GroupFactory staged_mesh_groups(cudaStream_t compute_stream);

}  // namespace mt
