#include "megatrain/train/node_data.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "megatrain/comm/agreement.h"
#include "megatrain/core/error.h"

namespace mt {

namespace {

bool needs_tokens(const MeshShape& shape, const MeshCoord& c) { return c.pp == 0 || c.pp == shape.pp - 1; }

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

std::unique_ptr<DataLoader> make_loader(const RunConfig& cfg, int rank, int world, int prefetch, int replicas = 1) {
  // With pp a step's rows per dp rank are micro x data.batch_size: every pp rank reads them (the first stage uses
  // the tokens, the last the targets), in the order a single process with micro x dp times the batch reads them.
  return std::make_unique<DataLoader>(cfg.data.sources(), "train",
                                      cfg.data.batch_size * cfg.pipeline_microbatches() * replicas, cfg.data.seq_len,
                                      cfg.data.shuffle, cfg.data.seed, rank, world, prefetch, cfg.model.vocab_size);
}

}  // namespace

bool contiguous_node(const RankInfo& info, const std::vector<int>& starts) {
  const int first = info.rank - info.local_rank;
  auto it = std::find(starts.begin(), starts.end(), first);
  if (it == starts.end()) return false;
  const int next = std::next(it) == starts.end() ? info.world_size : *std::next(it);
  return next == first + info.local_world_size;
}

bool node_loader_on(const RunConfig& cfg, const Topology& topo) {
  if (!cfg.data.node_loader || !topo.host_mesh) return false;
  Agreement agree(topo.host_mesh.get());
  const std::vector<int> starts = agree.which_ranks(topo.rank_info.local_rank == 0);
  const bool broken = agree.any_rank(!contiguous_node(topo.rank_info, starts));
  if (broken) {
    if (topo.main_rank)
      fmt::print("data: a loader per rank: the nodes' ranks are not numbered in contiguous blocks (ranks that are "
                 "local rank 0: {}; each node's reader serves the block that starts there)\n",
                 fmt::join(starts, ", "));
    return false;
  }
  return topo.rank_info.local_world_size > 1;
}

NodeLoaderPlan node_loader_plan(const RunConfig& cfg, const RankInfo& info, const MeshShape& shape) {
  NodeLoaderPlan p;
  const int first = info.rank - info.local_rank;
  p.node = first / info.local_world_size;
  p.local_rank = info.local_rank;
  // The job's store and this attempt's namespace in it (a restarted attempt gets its own segment), the user, the node.
  p.name = fmt::format("/megatrain-data-{:016x}-node{}",
                       fnv1a(info.store_url + "|" + info.store_prefix + "|" + std::to_string(::getuid())), first);
  for (int l = 0; l < info.local_world_size; ++l) {
    const int rank = first + l;
    if (rank >= shape.world()) break;
    const MeshCoord c = mesh_coord(shape, rank);
    if (!needs_tokens(shape, c)) continue;
    auto it = std::find(p.replicas.begin(), p.replicas.end(), c.dp);
    if (it == p.replicas.end()) it = p.replicas.insert(p.replicas.end(), c.dp);
    if (l == info.local_rank) {
      p.consumer = p.consumers;
      p.replica = static_cast<int>(it - p.replicas.begin());
    }
    ++p.consumers;
  }
  p.slots = std::clamp(cfg.data.prefetch + 1, 2, kNodeRingMaxSlots);
  p.timeout_s = cfg.parallel.timeout_s;
  return p;
}

std::unique_ptr<DataLoader> open_train_loader(const RunConfig& cfg, const Topology& topo) {
  // Straggler coding: any replica may compute any micro-batch of the step, so each reads the whole global batch
  // (one loader of dp x data.batch_size rows: the same rows, order and positions as dp loaders of data.batch_size).
  if (cfg.parallel.straggler_coding != StragglerScheme::None) {
    if (cfg.data.node_loader && topo.main_rank && topo.rank_info.local_world_size > 1)
      fmt::print("data: a loader per rank reading the whole global batch (parallel.straggler_coding; "
                 "data.node_loader is not used)\n");
    return make_loader(cfg, 0, 1, cfg.data.prefetch, topo.shape.dp);
  }
  if (!node_loader_on(cfg, topo)) return make_loader(cfg, topo.coord.dp, topo.shape.dp, cfg.data.prefetch);
  const NodeLoaderPlan plan = node_loader_plan(cfg, topo.rank_info, topo.shape);
  // This rank's loader computes positions only: no prefetch thread, no reads.
  std::unique_ptr<DataLoader> loader = make_loader(cfg, topo.coord.dp, topo.shape.dp, 0);
  std::unique_ptr<NodeReader> reader;
  if (plan.local_rank == 0 && plan.consumers > 0)
    reader = std::make_unique<NodeReader>(plan, make_loader(cfg, 0, topo.shape.dp, 0));
  loader->set_row_feed(std::make_unique<NodeFeed>(plan, std::move(reader), loader->batch_rows(), loader->seq_len()));
  if (topo.main_rank)
    fmt::print("data: one reader per node (a thread of local rank 0) feeds {} of its {} ranks through shared memory\n",
               plan.consumers, topo.rank_info.local_world_size);
  return loader;
}

}  // namespace mt
