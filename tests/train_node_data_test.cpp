// Which ranks a node's shared loader serves (train/node_data.h), without processes: the node's block of ranks, who
// needs tokens, and the check that a launcher numbered each node's ranks in one contiguous block.
#include <gtest/gtest.h>

#include <vector>

#include "megatrain/train/node_data.h"
#include "megatrain/train/run_config.h"

namespace mt {
namespace {

RankInfo rank(int r, int local, int local_world, int world) {
  RankInfo i;
  i.rank = r;
  i.local_rank = local;
  i.local_world_size = local_world;
  i.world_size = world;
  return i;
}

// Two nodes of four, numbered in blocks (megatrain launch, torchrun, Slurm's block distribution): every rank passes.
TEST(NodeData, BlocksOfRanksAreContiguousNodes) {
  const std::vector<int> starts = {0, 4};
  for (int r = 0; r < 8; ++r) EXPECT_TRUE(contiguous_node(rank(r, r % 4, 4, 8), starts)) << "rank " << r;
}

// Slurm's cyclic distribution: node 0 holds ranks 0, 2, 4, 6 (local 0..3), node 1 ranks 1, 3, 5, 7. The ranks that
// are local rank 0 are 0 and 1; rank 2 (local 1 of node 0) would look for a block starting at 1 of 4 ranks, which
// the next start (none: the world's end, 8) contradicts, and rank 4 (local 2) for one starting at 2, no start at
// all. So some rank fails, and the agreement turns the shared loader off everywhere.
TEST(NodeData, SlurmsCyclicDistributionIsNotContiguous) {
  const std::vector<int> starts = {0, 1};
  int failing = 0;
  for (int r = 0; r < 8; ++r) failing += !contiguous_node(rank(r, r / 2, 4, 8), starts);  // node r % 2
  EXPECT_GT(failing, 0);
  EXPECT_FALSE(contiguous_node(rank(2, 1, 4, 8), starts));
  EXPECT_FALSE(contiguous_node(rank(4, 2, 4, 8), starts));
}

// The last node may be smaller only if the world ends there; a node that claims more ranks than its block fails.
TEST(NodeData, TheLastBlockEndsAtTheWorldsEnd) {
  EXPECT_TRUE(contiguous_node(rank(5, 1, 2, 6), {0, 2, 4}));
  EXPECT_FALSE(contiguous_node(rank(5, 1, 4, 6), {0, 4}));  // a block of 4 from 4 runs past a world of 6
}

// Which local ranks copy rows: with pp 4 on one node of 4 ranks, the first stage (tokens) and the last (targets);
// the two middle stages read none. The slots hold the one replica's rows.
TEST(NodeData, MiddlePipelineStagesReadNoTokens) {
  RunConfig cfg;
  MeshShape shape;
  shape.dp = 1;
  shape.pp = 4;
  shape.tp = 1;
  std::vector<int> consumer;
  for (int r = 0; r < 4; ++r) {
    const NodeLoaderPlan p = node_loader_plan(cfg, rank(r, r, 4, 4), shape);
    EXPECT_EQ(p.consumers, 2);
    EXPECT_EQ(p.replicas, std::vector<int>{0});
    consumer.push_back(p.consumer);
  }
  EXPECT_EQ(consumer, (std::vector<int>{0, -1, -1, 1}));
}

}  // namespace
}  // namespace mt
