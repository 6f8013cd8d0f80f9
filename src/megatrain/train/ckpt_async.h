// The state of two-stage checkpoint saves that the background thread shares with the training thread, and the
// background tasks (train/checkpoint/staged_save.h describes the protocol).
//
// Memory: `own` holds this rank's snapshots, `held` its predecessor's (peer copies). Without peer copies one own
// slot is used; with them two of each, alternating, so that at every moment the newest snapshot that every rank
// has fully exchanged survives in memory somewhere (see train/checkpoint/staged_save.h).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "megatrain/ckpt/snapshot.h"
#include "megatrain/core/error.h"
#include "megatrain/train/observer.h"
#include "megatrain/train/peer_links.h"

namespace mt {

struct CkptAsyncState {
  // Fixed for the run.
  std::string root;       // ckpt.dir
  bool main_rank = true;  // commits (sharded) / writes (single process)
  bool single = true;     // a single process: one format-1 checkpoint, no commit protocol
  int world = 1;
  std::vector<std::string> files;  // every rank's shard file name (the commit waits for all of them)
  int keep_last = 0;
  std::string protect;            // the checkpoint this run resumed from: never pruned
  double commit_timeout_s = 600;  // how long rank 0 waits for the other ranks' shard files
  double stage2_delay_s = 0;      // the stage2_delay fault (tests: a kill that lands inside stage 2)
  std::unique_ptr<PeerLinks> peers;

  ShardSnapshot own[2], held[2];
  std::atomic<bool> own_ok[2] = {false, false}, held_ok[2] = {false, false};

  // Written by the tasks, read by the training thread (under mu).
  std::mutex mu;
  std::vector<CheckpointEvent> events;
  std::string exchange_error;  // the last peer copy's failure
  ErrorKind exchange_kind = ErrorKind::PeerLost;
  bool persist_failed = false;  // the last persist failed (on this rank; on rank 0: or its commit)
  std::string persist_message, committed_dir;

  void event(CheckpointEvent e);
};

// Stage 2 of snapshot `slot`: writes this rank's shard (fsynced); on rank 0 then waits for every rank's shard and
// commits. Every outcome is an event; nothing throws.
void persist_snapshot(CkptAsyncState& st, int slot, SaveWhy why, double t_snapshot);

// Copies own[slot] to the buddy and receives the predecessor's into held[slot].
void exchange_snapshot(CkptAsyncState& st, int slot);

// After a lost peer: writes every complete snapshot this rank holds (its own, its predecessor's) under
// root/snapshots/step_N/, for the restarted job to recover from (promote_peer_snapshots).
void persist_survivor_snapshots(CkptAsyncState& st);

// Restarted job, one process (rank 0) before the restore: the newest complete set of survivor-persisted snapshots
// newer than the latest committed checkpoint becomes a committed checkpoint (the ordinary restore then loads it).
// Returns its directory, or "" (with a line saying why, when sets exist but none is complete). Every set that can
// no longer be used (at or below the latest checkpoint, incomplete, unreadable) is removed.
std::string promote_peer_snapshots(const std::string& root, int keep_last);

}  // namespace mt
