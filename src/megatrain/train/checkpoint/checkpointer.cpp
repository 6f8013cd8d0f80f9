// The checkpointer's facade (TrainCheckpointer, train/checkpointing.h): the trainer's one object for checkpoints,
// which routes each call to the part that does the job (train/checkpoint/):
//   run_position   what a checkpoint records besides tensors, and how a resumed run takes up its position;
//   shard_layout   which rank writes and reads which piece (pure functions of the layout);
//   finite_guard   no checkpoint with a non-finite value (every rank refuses together);
//   gathered_save  ckpt.sharded = false in a parallel run: full tensors gathered to rank 0;
//   staged_save    every other save: two stages (a snapshot in memory, then files in the background), peer copies;
//   restore        a checkpoint of any layout into this rank, model.init_from, resume = auto;
//   shared_dir     the start-up probe that every rank sees ckpt.dir.
// Every collective among ranks goes through one Agreement (comm/agreement.h) over the host mesh. The facade holds
// no protocol of its own: it picks the save (gathered or staged), remembers the data's window count, and marks the
// checkpoint a run resumed from as never pruned.
#include "megatrain/train/checkpointing.h"

#include "megatrain/comm/agreement.h"
#include "megatrain/core/clock.h"
#include "megatrain/train/checkpoint/gathered_save.h"
#include "megatrain/train/checkpoint/restore.h"
#include "megatrain/train/checkpoint/shard_layout.h"
#include "megatrain/train/checkpoint/shared_dir.h"
#include "megatrain/train/checkpoint/staged_save.h"
#include "megatrain/train/peer_links.h"

namespace mt {

struct TrainCheckpointer::Impl {
  const RankHoldings h;
  Agreement agreement;  // over the host mesh (trivial in a single process)
  const bool sharded;   // each rank writes its own pieces (shard_layout.h); else rank 0 writes gathered full tensors
  const bool staged;    // two-stage saves: every layout but a gathered parallel one
  SaveFacts facts;      // the data's windows per epoch (set_data_windows), the replicas' agreement (set_replica_hash)
  GatheredSave gathered;
  StagedSave staged_save;

  Impl(const RunConfig& c, GPT& m, Optimizer* o, DataParallel* d, DeviceMesh* me, int wc, DataParallel* ed)
      : h{c, m, o, d, me, wc, ed}, agreement(me), sharded(me && c.ckpt.sharded), staged(!me || c.ckpt.sharded),
        gathered(h), staged_save(h, staged) {}
};

TrainCheckpointer::TrainCheckpointer(const RunConfig& cfg, GPT& model, Optimizer* opt, DataParallel* ddp,
                                     DeviceMesh* mesh, int wte_copy, DataParallel* expert_ddp)
    : impl_(std::make_unique<Impl>(cfg, model, opt, ddp, mesh, wte_copy, expert_ddp)) {}

TrainCheckpointer::~TrainCheckpointer() = default;

std::string TrainCheckpointer::save(int step, const LoaderState& data, SaveWhy why) {
  Impl& s = *impl_;
  if (s.staged) return s.staged_save.save(step, data, s.facts, why, /*wait=*/true);
  return s.gathered.save(step, data, s.facts, why, s.agreement);
}

void TrainCheckpointer::snapshot(int step, const LoaderState& data, SaveWhy why) {
  Impl& s = *impl_;
  const bool wait = why == SaveWhy::Final || why == SaveWhy::Stop || !s.h.cfg.ckpt.async;
  if (!s.staged) {  // a gathered parallel checkpoint: synchronous, as it always was
    if (why == SaveWhy::Snapshot) return;
    const double t0 = now_seconds();
    const std::string dir = save(step, data, why);
    if (s.h.main_rank()) s.staged_save.event({step, CheckpointStage::Committed, why, dir, "", now_seconds() - t0});
    return;
  }
  s.staged_save.save(step, data, s.facts, why, wait);
}

bool TrainCheckpointer::snapshot_due(int step) const { return impl_->staged_save.snapshot_due(step); }

std::vector<CheckpointEvent> TrainCheckpointer::take_events() { return impl_->staged_save.take_events(); }

void TrainCheckpointer::wait() { impl_->staged_save.wait(); }

void TrainCheckpointer::check_shared_dir() {
  if (impl_->sharded) mt::check_shared_dir(impl_->h.cfg, impl_->h.mesh, impl_->agreement);
}

void TrainCheckpointer::set_data_windows(uint64_t windows) { impl_->facts.windows = windows; }

void TrainCheckpointer::set_replica_hash(int step, uint64_t hash) {
  impl_->facts.agreed_step = step;
  impl_->facts.agreed_hash = hash;
}

void TrainCheckpointer::set_peer_links(std::unique_ptr<PeerLinks> links) {
  impl_->staged_save.set_peer_links(std::move(links));
}

TrainObserver* TrainCheckpointer::survivor() { return impl_->staged_save.survivor(); }

int TrainCheckpointer::restore(const std::string& path, LoaderState& data) {
  Impl& s = *impl_;
  const Restored r = restore_checkpoint(s.h, s.agreement, s.facts.windows, path, data);
  s.staged_save.protect(r.dir);
  return r.step;
}

void TrainCheckpointer::init_params(const std::string& path) { mt::init_params(impl_->h, impl_->agreement, path); }

int TrainCheckpointer::restore_auto(LoaderState& data, std::string& from) {
  Impl& s = *impl_;
  const Restored r = restore_newest(s.h, s.agreement, s.facts.windows, s.staged, data);
  if (r.step >= 0) {
    from = r.from;
    s.staged_save.protect(r.dir);
  }
  return r.step;
}

}  // namespace mt
