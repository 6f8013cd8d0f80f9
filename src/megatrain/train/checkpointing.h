// Checkpoints of a training run in any parallel layout. A rank holds a possibly sharded part of the model and
// optimizer state (ZeRO-2 moment shards over dp, tensor shards over tp, its pipeline stages over pp); a checkpoint
// describes the full tensors (parameters, optimizer moments) and the run's position, so a run resumes under any
// layout. A parallel run saves sharded (ckpt.sharded, the default): every rank writes the pieces it uniquely
// holds to its own file (parameters: the dp-rank-0 replica of each TP shard; moments: each dp rank's ZeRO slices;
// replicated tensors: tp rank 0 only) and rank 0 commits the manifest. With ckpt.sharded = false, or in a single
// process, the full tensors are gathered to rank 0, which writes one file per group. Restoring reads, from either
// kind, only the slices this rank holds.
//
// Saves go in two stages (ckpt.async): stage 1, on the training thread, copies this rank's pieces into a snapshot
// in memory allocated once (ckpt/snapshot.h) and checks them finite; stage 2, on a background thread, writes the
// snapshot as this rank's shard file (fsynced, then its record: the "done" marker) and, on rank 0, waits for every
// rank's record and commits the manifest. A failure in stage 2 is an event; the previous checkpoint stays latest.
// Every ckpt.snapshot_every steps the snapshot is also copied to a buddy rank (train/peer_links.h); when ranks are
// lost the survivors write what they hold, and resume = auto recovers from it. Restoring reads each replicated
// tensor once per dp group and broadcasts it (ckpt.one_reader).
//
// TrainCheckpointer is a facade: each job is a part under train/checkpoint/ (run_position, shard_layout,
// finite_guard, gathered_save, staged_save, restore, shared_dir), whose header states its protocol and invariants;
// checkpoint/checkpointer.cpp routes the calls.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "megatrain/train/observer.h"
#include "megatrain/train/run_config.h"

namespace mt {

class GPT;
class Optimizer;
class DataParallel;
class DeviceMesh;
struct LoaderState;
struct PeerLinks;

class TrainCheckpointer {
 public:
  // The optimizer is either opt (one dp rank) or ddp (ZeRO-2 over the dp group); mesh is null in a single
  // process. wte_copy: the parameter index of the last pipeline stage's copy of a tied wte (not saved), or -1.
  // expert_ddp: with expert parallelism, the expert tensors' ZeRO-2 over the expert-dp group (ddp: the rest).
  TrainCheckpointer(const RunConfig& cfg, GPT& model, Optimizer* opt, DataParallel* ddp, DeviceMesh* mesh, int wte_copy,
                    DataParallel* expert_ddp = nullptr);
  ~TrainCheckpointer();
  TrainCheckpointer(const TrainCheckpointer&) = delete;
  TrainCheckpointer& operator=(const TrainCheckpointer&) = delete;

  // Collective over every rank: writes checkpoint `step` (data: the loader position to resume from; why: for the
  // log line and the events; not Snapshot), then waits until rank 0 has committed it. Returns the checkpoint
  // directory on rank 0, "" on the other ranks. Throws (kind IO on every rank) when any part of it failed.
  std::string save(int step, const LoaderState& data, SaveWhy why);

  // The trainer's save (collective): Periodic takes stage 1 now and leaves stage 2 to the background (with
  // ckpt.async; else it waits, as save()); Final and Stop wait until committed (and throw if not); Snapshot takes a
  // snapshot for the peer copy only (nothing is written). A gathered parallel layout (ckpt.sharded = false) always
  // saves synchronously. Progress arrives as events (take_events).
  void snapshot(int step, const LoaderState& data, SaveWhy why);
  // A peer copy is due after `step` (ckpt.snapshot_every, when there are peer links).
  bool snapshot_due(int step) const;
  // The checkpoint events since the last call, in order (snapshot, persisted, committed, failed).
  std::vector<CheckpointEvent> take_events();
  // Waits for the background work (the end of a run).
  void wait();
  // Collective over every rank, for a sharded parallel run (else nothing): throws kind Config on every rank when some
  // rank does not see the ckpt.dir rank 0 sees (no shared file system), naming those ranks. Call it at start: such a
  // run's saves can never commit.
  void check_shared_dir();
  // The number of windows in an epoch of the training data (DataLoader::windows_per_epoch): saved with the data
  // position, whose shuffled order depends on it, and compared on resume (a mismatch is a warning).
  void set_data_windows(uint64_t windows);
  // The last step at which the data-parallel replicas agreed on their parameters (train/sdc_check.h) and this
  // rank's hash there: a save of that step records it (extra.sdc); a save of any other step records none.
  void set_replica_hash(int step, uint64_t hash);
  // The links to the buddy ranks of the peer copies (train/peer_links.h); without them there are none.
  void set_peer_links(std::unique_ptr<PeerLinks> links);
  // An observer for the trainer's list: when the run fails with a lost peer or a timeout, it writes the snapshots
  // this rank holds (its own, its predecessor's) under ckpt.dir/snapshots/ for the restarted job.
  TrainObserver* survivor();

  // Loads the checkpoint at path (sharded or not, of any layout) into this rank's parameters and optimizer moments
  // after checking that it fits this run (model config, optimizer, global batch); sets data to its loader
  // position and returns its step. Every rank reads only the pieces overlapping what it holds.
  int restore(const std::string& path, LoaderState& data);
  // model.init_from under any layout, from a megatrain checkpoint (any layout wrote it, or `megatrain convert`) or an
  // HF GPT-2 or Llama model: this rank's slices of the parameters only (no moments, no data position, no step),
  // after checking that the source holds this run's model (check_same_architecture) and no tensor it lacks.
  // Collective: a read that fails on any rank fails on every rank, naming it.
  void init_params(const std::string& path);
  // ckpt.resume = auto (collective): commits a complete set of survivors' peer snapshots newer than the latest
  // checkpoint, then restores the newest checkpoint that reads back whole, skipping (with a warning naming the
  // file) a corrupt or partial one. Returns its step and sets `from`, or -1 when there is no checkpoint at all.
  int restore_auto(LoaderState& data, std::string& from);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
