// The training data of a rank, read by its node's shared loader (data/node_loader.h) or by its own DataLoader
// (data.node_loader = false). Here the node's layout is worked out from the launcher's environment and the mesh:
// the node's ranks are global ranks rank - LOCAL_RANK .. + LOCAL_WORLD_SIZE - 1 (megatrain launch, torchrun and
// Slurm's block distribution number a node's ranks contiguously; the ranks check that together first, and a job
// whose nodes are not blocks, as under Slurm's cyclic distribution, keeps a loader per rank), a
// rank needs tokens unless it is a middle pipeline stage (the first stage embeds the tokens, the last scores the
// targets; with interleaved stages too, chunk 0 is on pp rank 0 and the last chunk on pp rank pp-1), and the slots
// hold the rows of the dp ranks of the node's ranks that need tokens. A single process, or a node of one rank,
// keeps its own loader: there is nothing to share.
#pragma once
#include <vector>

#include "megatrain/data/loader.h"
#include "megatrain/data/node_loader.h"
#include "megatrain/train/run_config.h"
#include "megatrain/train/topology.h"

namespace mt {

// Whether this rank's node shares one loader: data.node_loader, more than one rank on the node, and every node's
// ranks numbered contiguously (contiguous_node, agreed by all ranks: collective over every rank when
// data.node_loader is set and the job has several ranks; where any node is not, every rank keeps its own loader
// and the main rank says why).
bool node_loader_on(const RunConfig& cfg, const Topology& topo);
// Whether the node `info` places this rank on is a contiguous block: first = rank - local_rank must be one of the
// ranks that are local rank 0 (`starts`, ascending, every rank's view agreed) and the next start after it (or the
// world's end) must be first + local_world_size. megatrain launch, torchrun and Slurm's default block distribution
// pass; Slurm's cyclic distribution (node 0 holds ranks 0, 2, 4, ...) fails on some rank. Pure.
bool contiguous_node(const RankInfo& info, const std::vector<int>& starts);
// This rank's view of its node's loader. Pure: from the rank info and the mesh shape (tests/train_node_data_test).
NodeLoaderPlan node_loader_plan(const RunConfig& cfg, const RankInfo& info, const MeshShape& shape);
// The training split's loader of this rank: with node_loader_on, fed by its node's reader (local rank 0 starts it).
std::unique_ptr<DataLoader> open_train_loader(const RunConfig& cfg, const Topology& topo);

}  // namespace mt
