// The two-stage save with its peer copies: the checkpoint every layout but a gathered parallel one writes
// (ckpt.sharded, the default; and a single process).
//
// Protocol (collective over every rank):
//   stage 1, on the training thread: this rank's pieces (shard_layout.h) are copied into a snapshot in memory
//     allocated once (ckpt/snapshot.h) and checked finite; every rank agrees that none holds a non-finite value
//     (finite_guard.h; also the barrier after rank 0 began the sharded checkpoint). The step goes on.
//   stage 2, on a background thread (train/ckpt_async.h): the snapshot is written as this rank's shard file
//     (fsynced, then its record: the "done" marker); rank 0 waits for every rank's record and commits the manifest.
//     A failure is an event (CheckpointStage::Failed); the previous checkpoint stays latest.
//   peer copies: every ckpt.snapshot_every steps (SaveWhy::Snapshot: nothing is written) and with every save, the
//     snapshot is also copied to a buddy rank (train/peer_links.h) in the background. Before the next stage 1 every
//     rank agrees that every copy of the previous snapshot completed, or all fail together (PeerLost).
//   waited saves (final, stop, ckpt.async = false): every rank leaves only once rank 0 has committed, and every
//     rank fails together (IO) when any part failed.
//   survivors: when the run fails with a lost peer or a timeout, the survivor observer writes the snapshots this
//     rank holds (its own, its predecessor's) under ckpt.dir/snapshots/ for resume = auto (restore.h).
//
// Invariants:
//  * slots: with peer copies snapshot k goes to own[k % 2] (the buddy's copy to its held[k % 2]); before anyone
//    overwrites slot k % 2 (snapshot k-2) every rank has finished its copy of snapshot k-1. So whenever a rank
//    dies, either every copy of k-1 completed (set k-1 survives) or nobody passed that point and set k-2 is whole;
//  * one save is in flight at a time: stage 1 first waits for the previous save's background work;
//  * events are delivered in order (snapshot, persisted, committed | failed) through take_events.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "megatrain/comm/agreement.h"
#include "megatrain/data/loader.h"
#include "megatrain/train/checkpoint/run_position.h"
#include "megatrain/train/checkpoint/shard_layout.h"
#include "megatrain/train/observer.h"

namespace mt {

struct PeerLinks;

class StagedSave {
 public:
  // enabled: saves go in two stages (every layout but a gathered parallel one). Disabled, only the event queue and
  // the background thread exist (a gathered save reports its commits through event()). The snapshot memory of runs
  // that save periodically is reserved in the background now.
  StagedSave(const RankHoldings& h, bool enabled);
  ~StagedSave();
  StagedSave(const StagedSave&) = delete;
  StagedSave& operator=(const StagedSave&) = delete;

  // Stage 1 of checkpoint `step` now; stage 2 (unless why is Snapshot) and the peer copy posted to the background.
  // wait: also waits until committed (and throws on every rank if any part failed); returns the committed
  // directory on rank 0 then, else "". facts: for the manifest (run_position.h).
  std::string save(int step, const LoaderState& data, const SaveFacts& facts, SaveWhy why, bool wait);
  // A peer copy is due after `step` (ckpt.snapshot_every, when there are peer links).
  bool snapshot_due(int step) const;
  void set_peer_links(std::unique_ptr<PeerLinks> links);
  // The checkpoint this run resumed from: never pruned.
  void protect(const std::string& dir);
  void event(CheckpointEvent e);
  std::vector<CheckpointEvent> take_events();
  void wait();  // for the background work
  TrainObserver* survivor();

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::unique_ptr<TrainObserver> survivor_;
};

}  // namespace mt
