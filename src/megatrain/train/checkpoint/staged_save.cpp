#include "megatrain/train/checkpoint/staged_save.h"

#include <fmt/format.h>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <mutex>
#include <utility>

#include "megatrain/ckpt/sharded.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/core/fault_spec.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/train/attempt_fence.h"
#include "megatrain/train/checkpoint/finite_guard.h"
#include "megatrain/train/checkpoint/run_position.h"
#include "megatrain/train/ckpt_async.h"
#include "megatrain/train/ckpt_worker.h"
#include "megatrain/train/peer_links.h"

namespace mt {

namespace {

// How long a failing run with every rank alive lets a save in stage 2 finish.
constexpr double kFinishOnErrorSeconds = 30;

}  // namespace

struct StagedSave::State {
  const RankHoldings h;
  Agreement agreement;  // over the host mesh (trivial in a single process)
  const bool enabled;
  // The state the background thread shares, the thread.
  std::shared_ptr<CkptAsyncState> as;
  std::unique_ptr<CkptWorker> worker;
  std::deque<HostBuffer> piece_staging;  // pieces not contiguous in memory, copied out before stage 1 copies them
  int snapshots = 0;
  bool failing = false;  // the run is failing: do not wait for a background copy to a dead peer at destruction
  std::vector<Fault> kill_faults;  // kill_after_snapshot faults for this rank (tests)
  int attempt = 0;                 // MEGATRAIN_ATTEMPT, for their message

  State(const RankHoldings& holdings, bool on)
      : h(holdings), agreement(holdings.mesh), enabled(on), as(std::make_shared<CkptAsyncState>()),
        worker(std::make_unique<CkptWorker>()) {
    const RunConfig& c = h.cfg;
    as->root = c.ckpt.dir;
    as->main_rank = h.main_rank();
    as->single = !h.mesh;
    as->world = c.parallel.dp * c.parallel.pp * c.parallel.tp;
    as->files = shard_files(c.parallel);
    as->keep_last = c.ckpt.keep_last;
    // Rank 0 waits this long for the other ranks' shards: generous, a slow disk is not a dead rank.
    as->commit_timeout_s = std::max(600.0, 5.0 * c.parallel.timeout_s);
    // Test faults (core/fault_spec.h): a delay before every stage 2, a kill right after a stage 1.
    const int rank = h.mesh ? h.mesh->rank() : 0;
    for (const Fault& f : faults_for(FaultKind::Stage2Delay, rank)) as->stage2_delay_s = f.seconds;
    kill_faults = faults_for(FaultKind::KillAfterSnapshot, rank);
    if (!kill_faults.empty()) attempt = attempt_from_env();
    // The snapshot memory is allocated and faulted in by the background thread now, so the first save's stall is
    // a copy, not 12 bytes per parameter of fresh pages (seconds at 124M). Only runs that save periodically.
    if (enabled && c.ckpt.every > 0) {
      std::vector<ShardPiece> layout = pieces_to_write(h, piece_staging);
      worker->post([st = as, layout] { st->own[0].reserve(layout); });
    }
  }

  ~State() {
    // A task blocked on a dead peer would block the join until its group's timeout: on the failure path the
    // worker is left running (its tasks own the shared state) and the process exits under it.
    if (failing && !worker->idle()) (void)worker.release();
  }

  // Stage 1 of checkpoint `step` on the training thread; stage 2 (and the peer copy) posted to the background.
  // Returns the committed directory on rank 0 when `wait`, else "". (Slots and agreements: staged_save.h.)
  std::string save(int step, const LoaderState& data, const SaveFacts& facts, SaveWhy why, bool wait) {
    const double t0 = now_seconds();
    worker->wait_idle();  // the previous save, if still in flight: its memory is about to be reused
    if (as->peers) {
      std::string err;
      ErrorKind kind;
      {
        std::lock_guard<std::mutex> lk(as->mu);
        err = as->exchange_error;
        kind = as->exchange_kind;
      }
      const std::vector<int> bad = agreement.which_ranks(!err.empty());
      if (!err.empty())
        fail_as(kind, "step {}: copying this rank's snapshot to buddy rank {} failed: {}", step, as->peers->buddy, err);
      if (!bad.empty())
        fail_as(ErrorKind::PeerLost,
                "step {}: rank(s) {} could not copy their snapshot to their buddy (their errors "
                "say why)",
                step, fmt::join(bad, ", "));
    }
    const bool persist = why != SaveWhy::Snapshot;
    const int slot = as->peers ? snapshots % 2 : 0;
    as->own_ok[slot] = false;
    if (persist && h.mesh && h.main_rank()) begin_sharded_checkpoint(h.cfg.ckpt.dir, step);
    for (DataParallel* zero : h.zero_instances()) zero->sync_params();
    piece_staging.clear();
    const MeshCoord c = h.coord();
    const bool finite = as->own[slot].stage(step, shard_file_name(c.pp, c.tp, c.dp), pieces_to_write(h, piece_staging),
                                            checkpoint_extra(h.cfg, step, data, facts));
    // collective: also the barrier after begin_sharded_checkpoint
    refuse_non_finite(h, agreement, step, finite && pieces_cover_holdings(h));
    as->own_ok[slot] = true;
    ++snapshots;
    as->event({step, CheckpointStage::Snapshot, why, "", "", now_seconds() - t0});
    if (as->peers) worker->post([st = as, slot] { exchange_snapshot(*st, slot); });
    if (persist) worker->post([st = as, slot, why, t0] { persist_snapshot(*st, slot, why, t0); });
    kill_after_snapshot(step);
    if (!wait) return "";

    // Waited for (a synchronous save, the final and the stop checkpoint): every rank leaves only once rank 0 has
    // committed, and every rank fails together when any part failed.
    worker->wait_idle();
    bool failed;
    std::string msg, dir;
    {
      std::lock_guard<std::mutex> lk(as->mu);
      failed = persist && as->persist_failed;
      msg = as->persist_message;
      dir = as->committed_dir;
    }
    const std::vector<int> bad = agreement.which_ranks(failed);
    if (failed) fail_as(ErrorKind::IO, "checkpoint ({}) step {} failed: {}", kind_name(why), step, msg);
    if (!bad.empty())
      fail_as(ErrorKind::IO,
              "checkpoint ({}) step {} was not committed: rank(s) {} failed to write (their errors say "
              "why)",
              kind_name(why), step, fmt::join(bad, ", "));
    return h.main_rank() && persist ? dir : "";
  }

  // Tests only (the kill_after_snapshot fault, core/fault_spec.h): this rank dies by SIGKILL right after stage 1
  // of `step`, its background work just posted: a rank lost with its snapshot only in memory.
  void kill_after_snapshot(int step) {
    for (const Fault& f : kill_faults) {
      if (f.step != step) continue;
      const int me = h.mesh ? h.mesh->rank() : 0;
      fmt::print(stderr, "fault injected: {} (rank {}, step {}, attempt {}): killed after the snapshot of step {}\n",
                 f.item, me, step, attempt, step);
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
  }
};

StagedSave::StagedSave(const RankHoldings& h, bool enabled) : s_(std::make_unique<State>(h, enabled)) {}

StagedSave::~StagedSave() = default;

std::string StagedSave::save(int step, const LoaderState& data, const SaveFacts& facts, SaveWhy why, bool wait) {
  return s_->save(step, data, facts, why, wait);
}

bool StagedSave::snapshot_due(int step) const {
  const int every = s_->h.cfg.ckpt.snapshot_every;
  return s_->as->peers && every > 0 && step % every == 0;
}

void StagedSave::set_peer_links(std::unique_ptr<PeerLinks> links) {
  State& s = *s_;
  s.worker->wait_idle();  // the background thread reads `peers`
  s.as->peers = std::move(links);
  if (s.as->peers) {  // both own slots, faulted in off the training thread (see the constructor)
    std::vector<ShardPiece> layout = pieces_to_write(s.h, s.piece_staging);
    const bool first_reserved = s.h.cfg.ckpt.every > 0;
    s.worker->post([st = s.as, layout, first_reserved] {
      if (!first_reserved) st->own[0].reserve(layout);
      st->own[1].reserve(layout);
    });
  }
}

void StagedSave::protect(const std::string& dir) { s_->as->protect = dir; }

void StagedSave::event(CheckpointEvent e) { s_->as->event(std::move(e)); }

std::vector<CheckpointEvent> StagedSave::take_events() {
  std::lock_guard<std::mutex> lk(s_->as->mu);
  return std::exchange(s_->as->events, {});
}

void StagedSave::wait() { s_->worker->wait_idle(); }

TrainObserver* StagedSave::survivor() {
  // On a failing run: a lost peer or a timeout means ranks may be gone; the snapshots this rank holds are written
  // out for the restarted job (persist_survivor_snapshots). Any failure: do not wait for background copies.
  struct Survivor final : TrainObserver {
    State* s;
    explicit Survivor(State* st) : s(st) {}
    void on_error(int, ErrorKind kind, const std::string&) override {
      // Every rank is alive (a non-finite loss, a data or I/O error): a periodic save in stage 2 holds good state
      // from before the failing step, so it may finish (bounded: rank 0's commit waits for every rank's shard)
      // and the restarted job loses fewer steps.
      if (kind != ErrorKind::PeerLost && kind != ErrorKind::CommTimeout && kind != ErrorKind::Device)
        s->worker->wait_idle_for(kFinishOnErrorSeconds);
      s->failing = true;
      if (s->as->peers && (kind == ErrorKind::PeerLost || kind == ErrorKind::CommTimeout)) {
        if (const std::string over = attempt_superseded(); !over.empty()) {
          fmt::print(stderr, "peer snapshot: none written: {}\n", over);
          std::fflush(stderr);
          return;
        }
        persist_survivor_snapshots(*s->as);
      }
    }
  };
  if (!survivor_) survivor_ = std::make_unique<Survivor>(s_.get());
  return survivor_.get();
}

}  // namespace mt
