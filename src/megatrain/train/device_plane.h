// Which GPU a rank of a GPU run uses, and how its device plane (the groups that move device memory: gradients,
// activations, tensor-parallel pieces) talks. NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so:
//  - nccl: local rank r uses GPU r; more local ranks than GPUs is a config error naming the ranks and the GPU
//    they would share, before NCCL could say it in its own words;
//  - staged: local rank r uses GPU r mod the GPUs visible, and the device plane stages device memory through
//    pinned host memory over Gloo (comm/staged_group.h): slower, but any layout runs on one GPU;
//  - auto: nccl when every local rank has a GPU of its own, staged when two share one.
// Every rank of a job must take the same plane (a group's members rendezvous on one backend), so the trainer makes
// any rank's staged the job's (train/topology.cpp); a node that decided nccl then keeps its GPU per rank.
// Pure: decided from the numbers, tested without a GPU.
#pragma once
#include <string>

#include "megatrain/train/run_config.h"

namespace mt {

struct DevicePlaneDecision {
  bool staged = false;
  int gpu = 0;      // the GPU this rank uses (an index among the visible ones)
  std::string why;  // for the run's first lines, e.g. "staged: 4 local ranks share 1 GPU"
};

// Throws mt::Error (kind Config) for nccl with more local ranks than GPUs, and when no GPU is visible.
DevicePlaneDecision decide_device_plane(DevicePlane asked, int local_rank, int local_world_size, int gpus);

}  // namespace mt
