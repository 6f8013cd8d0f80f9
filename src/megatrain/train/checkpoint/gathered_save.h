// The gathered save: the checkpoint a parallel run writes with ckpt.sharded = false. The full tensors are gathered
// to rank 0, which writes one file per group (model.safetensors, optim.safetensors) that any layout resumes from.
//
// Protocol (collective over every rank, synchronous): the ZeRO moment shards are gathered over dp, the tp shards
// over tp into full copies (allocated by the first save), then with pp the dp-0/tp-0 rank of every stage sends its
// full tensors to pp rank 0 over the pp group; rank 0 writes and commits the checkpoint, and a barrier keeps every
// rank from running ahead of a checkpoint that is not committed yet. Before anything is gathered every rank agrees
// that no rank holds a non-finite value (finite_guard.h).
//
// Invariants: what is written is the full model in the single-process layout (wte/lm_head at its padded_vocab()
// rows, no last-stage copy of a tied wte), whatever the run's layout; only rank 0 touches the file system.
#pragma once
#include <memory>
#include <string>

#include "megatrain/comm/agreement.h"
#include "megatrain/data/loader.h"
#include "megatrain/train/checkpoint/run_position.h"
#include "megatrain/train/checkpoint/shard_layout.h"
#include "megatrain/train/observer.h"

namespace mt {

class GatheredSave {
 public:
  explicit GatheredSave(const RankHoldings& h);
  ~GatheredSave();
  GatheredSave(const GatheredSave&) = delete;
  GatheredSave& operator=(const GatheredSave&) = delete;

  // Writes checkpoint `step` (data: the loader position; facts: for the manifest, run_position.h; why: for the log
  // line). Collective. Returns the checkpoint directory on rank 0, "" on the other ranks.
  std::string save(int step, const LoaderState& data, const SaveFacts& facts, SaveWhy why, Agreement& agreement);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace mt
