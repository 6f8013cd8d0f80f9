// The topology builder: where this process sits in the job and the groups it talks over.
//
// Two planes of groups, one name each everywhere:
// - the host mesh: Gloo groups over host memory, for what the host computes or stores (norms, losses, sampled
//   ids, checkpoint traffic);
// - the device mesh: the groups the model's tensors move over (gradient buckets, activations, parameters): the
//   host mesh itself on the CPU, NCCL groups on the compute stream on a GPU.
// Building it also checks the layout against the world size and that every rank runs the same effective config
// (train/config_agreement.h), before any group is made.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatrain/comm/env.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/comm/store.h"
#include "megatrain/kernels/ops.h"
#include "megatrain/train/run_config.h"

namespace mt {

// What the builders make themselves unless given (tests substitute them; see tests/train_planes_test.cpp).
struct TrainSeams {
  std::function<std::unique_ptr<Ops>()> make_ops;  // the backend (default: train.device's)
  // How the host mesh's groups (default: Gloo) and the device mesh's groups (default: NCCL on a GPU, the host
  // mesh itself on the CPU) are made.
  GroupFactory host_groups, device_groups;
};

struct Topology {
  RankInfo rank_info;  // from the launcher's environment (megatrain launch, torchrun, Slurm) or single
  MeshShape shape;
  MeshCoord coord;           // this rank's (dp, pp, tp); all 0 in a single process
  bool main_rank = true;     // global rank 0: prints progress and writes the metrics
  std::unique_ptr<Ops> ops;  // the backend: fp32 CPU, or bf16 CUDA (one GPU per local rank)
  GroupOptions group_options;
  std::unique_ptr<Store> store;           // null in a single process
  std::unique_ptr<DeviceMesh> host_mesh;  // null in a single process
  DeviceMesh* device_mesh = nullptr;      // host_mesh on the CPU; null in a single process

  // A device-plane group outside the mesh (e.g. the tied-embedding group): `role` is its kind, `name` names it.
  std::unique_ptr<ProcessGroup> make_device_group(GroupRole role, const std::string& name,
                                                  const std::vector<int>& ranks);

  GroupFactory host_groups;    // how host-plane groups outside the mesh are made (empty: Gloo); e.g. peer links
  GroupFactory device_groups;  // empty: Gloo (the device plane is the host plane)
  std::unique_ptr<DeviceMesh> own_device_mesh;  // set when the device plane has groups of its own
};

// Reads the rank from the environment, checks the layout, makes the backend, opens the store, agrees on the config
// and builds both meshes. Prints the mesh's init time on the main rank.
Topology build_topology(const RunConfig& cfg, const TrainSeams& seams);

}  // namespace mt
