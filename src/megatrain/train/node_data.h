// The training data of a rank, read by its node's shared loader (data/node_loader.h) or by its own DataLoader
// (data.node_loader = false). Here the node's layout is worked out from the launcher's environment and the mesh:
// the node's ranks are global ranks rank - LOCAL_RANK .. + LOCAL_WORLD_SIZE - 1 (megatrain launch, torchrun and
// Slurm number a node's ranks contiguously; a rank whose dp rank is not where the reader put it fails clearly), a
// rank needs tokens unless it is a middle pipeline stage (the first stage embeds the tokens, the last scores the
// targets; with interleaved stages too, chunk 0 is on pp rank 0 and the last chunk on pp rank pp-1), and the slots
// hold the rows of the dp ranks of the node's ranks that need tokens. A single process, or a node of one rank,
// keeps its own loader: there is nothing to share.
#pragma once
#include "megatrain/data/loader.h"
#include "megatrain/data/node_loader.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

// Whether this rank's node shares one loader (data.node_loader and more than one rank on the node).
bool node_loader_on(const RunConfig& cfg, const Topology& topo);
// This rank's view of its node's loader. Pure: from the rank info and the mesh shape (tests/train_node_data_test).
NodeLoaderPlan node_loader_plan(const RunConfig& cfg, const RankInfo& info, const MeshShape& shape);
// The training split's loader of this rank: with node_loader_on, fed by its node's reader (local rank 0 starts it).
std::unique_ptr<DataLoader> open_train_loader(const RunConfig& cfg, const Topology& topo);

}  // namespace mt
