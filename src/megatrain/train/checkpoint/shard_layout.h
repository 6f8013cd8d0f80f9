// The shard layout of a checkpoint: which rank writes which piece, and which rank reads what. Pure functions of
// the run's layout and what one rank holds (RankHoldings); nothing here communicates or touches a file.
//
// A checkpoint describes full tensors (parameters, optimizer moments) whatever layout wrote it. A rank holds a
// possibly sharded part of them: its pipeline stage's parameters, its tp shard of each, its ZeRO slices of the
// moments over dp. In a sharded save every rank writes, to its own shard file (shard_files), the pieces it
// uniquely holds (pieces_to_write):
//   * parameters: the dp-rank-0 replica of each tp shard (moments too, without ZeRO); an expert-parallel tensor's
//     shard: its expert-dp rank 0 (dp index < ep);
//   * ZeRO moment slices: each dp rank its own;
//   * tensors replicated over tp: tp rank 0 only; the last pipeline stage's copy of a tied wte: nobody.
// Each piece is a box of the full tensor in its saved shape (saved_shape: wte/lm_head at the single-process
// padded_vocab() rows; tp's coarser vocabulary padding is zero and not saved), cut into contiguous runs of tp's
// split dimension. A restore reads back, from a checkpoint of any layout, exactly the boxes this rank holds
// (read_box); with ckpt.one_reader only dp rank 0 reads the replicated state (reads_replicas) and broadcasts it.
//
// Invariants: the pieces of all ranks tile every saved tensor exactly once; a rank's pieces point into its own
// memory, or into `staging` for a box that is not contiguous there (staging must outlive the pieces).
#pragma once
#include <deque>
#include <string>
#include <vector>

#include "megatrain/ckpt/sharded.h"
#include "megatrain/ckpt/slice.h"
#include "megatrain/comm/mesh.h"
#include "megatrain/core/buffer.h"
#include "megatrain/model/gpt.h"
#include "megatrain/train/run_config.h"

namespace mt {

class Optimizer;
class DataParallel;

// What one rank holds and where it sits: the input of every layout decision (and of the saves and the restore).
struct RankHoldings {
  const RunConfig& cfg;
  GPT& model;
  Optimizer* opt;     // the full moments of one dp rank, or null
  DataParallel* ddp;  // ZeRO-2 moment slices over the dp group, or null
  DeviceMesh* mesh;   // the host mesh; null in a single process
  int wte_copy;       // the parameter index of the last pipeline stage's copy of a tied wte (never saved), or -1
  DataParallel* expert_ddp = nullptr;  // expert parallelism: the experts' ZeRO-2 slices over the expert-dp group

  MeshCoord coord() const { return mesh ? mesh->coord() : MeshCoord{}; }
  // The ZeRO-2 instances whose moment slices this rank holds (none, the dp one, or the dp and the expert-dp ones).
  std::vector<DataParallel*> zero_instances() const {
    std::vector<DataParallel*> v;
    for (DataParallel* d : {ddp, expert_ddp})
      if (d) v.push_back(d);
    return v;
  }
  bool main_rank() const { return !mesh || mesh->rank() == 0; }
};

// A tensor's shape in checkpoints: the full shape, but wte/lm_head at the single-process padded_vocab() rows.
std::vector<int64_t> saved_shape(const ModelConfig& model, const ParamInfo& info);

// Every rank's shard file name, in the order rank 0's commit waits for them (pp, then tp, then dp).
std::vector<std::string> shard_files(const ParallelConfig& parallel);

// What this rank uniquely holds, as pieces of the full tensors (see above); non-contiguous boxes are copied to
// staging.
std::vector<ShardPiece> pieces_to_write(const RankHoldings& h, std::deque<HostBuffer>& staging);

// Whether pieces_to_write is everything this rank holds (no replica left unread): a single process, or the
// dp-0/tp-0 rank of a stage without a tied wte copy. Then stage 1's finite check covers the rank's whole state.
bool pieces_cover_holdings(const RankHoldings& h);

// A gathered save: whether this rank sends (or, pp rank 0, writes) its stage's full tensors (dp 0, tp 0).
bool writes_gathered_stage(const RankHoldings& h);

// ckpt.one_reader over dp > 1: dp rank 0 reads the replicated state (parameters, and the moments without ZeRO) and
// broadcasts it over its dp group; ZeRO moment slices differ per dp rank, so each reads its own. Not with expert
// parallelism, whose dp ranks hold different experts: every rank reads its own.
bool one_reader(const RankHoldings& h);
// Whether this rank reads the replicated state itself (every rank, unless one_reader and dp rank > 0).
bool reads_replicas(const RankHoldings& h);

// Reads the slices of full tensor `name` that box `box` of tensor `info`'s shard holds into `data` (the box's
// elements, contiguous). Reader: a CheckpointReader, or an HfSliceReader (model.init_from of an HF model).
template <class Reader>
void read_box(Reader& ck, const ParamInfo& info, const std::string& name, const Slice& box, float* data) {
  for (const Placement& pl : shard_placements(info.shard, box)) {
    std::vector<int64_t> at(box.start.size());
    for (size_t d = 0; d < at.size(); ++d) at[d] = pl.local.start[d] - box.start[d];
    ck.read(name, pl.full, data, box.extent, at);
  }
}

}  // namespace mt
