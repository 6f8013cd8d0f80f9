// Checkpoints of a training run in any parallel layout. A rank holds a possibly sharded part of the model and
// optimizer state (ZeRO-2 moment shards over dp, tensor shards over tp, its pipeline stages over pp); a checkpoint
// always holds the full tensors (parameters, optimizer moments) and the run's position, so a run resumes under
// any layout. Saving gathers the shards and stages to rank 0, which writes; restoring slices the full tensors
// back into this rank's shards.
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

  // Collective over every rank: gathers the full state and writes checkpoint `step` (data: the loader position
  // to resume from; why: for the log line) from rank 0, then waits until it is committed. Returns the checkpoint
  // directory on rank 0, "" on the other ranks.
  std::string save(int step, const LoaderState& data, const char* why);

  // Loads the checkpoint at path into this rank's parameters and optimizer moments after checking that it fits
  // this run (model config, optimizer, global batch); sets data to its loader position and returns its step.
  int restore(const std::string& path, LoaderState& data);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
