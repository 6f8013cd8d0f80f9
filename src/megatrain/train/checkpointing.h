// Checkpoints of a training run in any parallel layout. A rank holds a possibly sharded part of the model and
// optimizer state (ZeRO-2 moment shards over dp, tensor shards over tp, its pipeline stages over pp); a checkpoint
// describes the full tensors (parameters, optimizer moments) and the run's position, so a run resumes under any
// layout. A parallel run saves sharded (ckpt.sharded, the default): every rank writes the pieces it uniquely
// holds to its own file (parameters: the dp-rank-0 replica of each TP shard; moments: each dp rank's ZeRO slices;
// replicated tensors: tp rank 0 only) and rank 0 commits the manifest. With ckpt.sharded = false, or in a single
// process, the full tensors are gathered to rank 0, which writes one file per group. Restoring reads, from either
// kind, only the slices this rank holds.
#pragma once
#include <memory>
#include <string>

#include "megatrain/train/run_config.h"

namespace mt {

class GPT;
class Optimizer;
class DataParallel;
class DeviceMesh;
struct LoaderState;

class TrainCheckpointer {
 public:
  // The optimizer is either opt (one dp rank) or ddp (ZeRO-2 over the dp group); mesh is null in a single
  // process. wte_copy: the parameter index of the last pipeline stage's copy of a tied wte (not saved), or -1.
  TrainCheckpointer(const RunConfig& cfg, GPT& model, Optimizer* opt, DataParallel* ddp, DeviceMesh* mesh,
                    int wte_copy);
  ~TrainCheckpointer();
  TrainCheckpointer(const TrainCheckpointer&) = delete;
  TrainCheckpointer& operator=(const TrainCheckpointer&) = delete;

  // Collective over every rank: writes checkpoint `step` (data: the loader position to resume from; why: for the
  // log line), then waits until rank 0 has committed it. Returns the checkpoint directory on rank 0, "" on the
  // other ranks.
  std::string save(int step, const LoaderState& data, const char* why);

  // Loads the checkpoint at path (sharded or not, of any layout) into this rank's parameters and optimizer moments
  // after checking that it fits this run (model config, optimizer, global batch); sets data to its loader
  // position and returns its step. Every rank reads only the pieces overlapping what it holds.
  int restore(const std::string& path, LoaderState& data);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
