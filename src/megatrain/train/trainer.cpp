#include "megatrain/train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <functional>
#include <vector>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "megatrain/comm/agreement.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/stop_request.h"
#include "megatrain/data/loader.h"
#include "megatrain/kernels/cpu/blas_probe.h"
#include "megatrain/obs/timeline.h"
#include "megatrain/train/checkpointing.h"
#include "megatrain/train/evaluate.h"
#include "megatrain/train/final_sample.h"
#include "megatrain/train/forward_backward.h"
#include "megatrain/train/host_mirror.h"
#include "megatrain/train/metrics.h"
#include "megatrain/train/model_stack.h"
#include "megatrain/train/moe_stats.h"
#include "megatrain/train/node_data.h"
#include "megatrain/train/output_dirs.h"
#include "megatrain/train/peak.h"
#include "megatrain/train/peer_links.h"
#include "megatrain/train/rank_guard.h"
#include "megatrain/train/sdc_check.h"
#include "megatrain/train/sdc_rerun.h"
#include "megatrain/train/start.h"
#include "megatrain/train/trace_window.h"
#include "megatrain/train/update.h"

namespace mt {

namespace {

// Calls one event on every observer.
struct Observers {
  std::vector<TrainObserver*> list;
  template <typename F>
  void each(F&& f) {
    for (TrainObserver* o : list) f(*o);
  }
};

// A step's span on the timeline, whose arguments carry the step's compute time (StepReport::compute_seconds) once
// it is known: the trace's heat map of slow ranks reads it (obs/heat_map.h). ScopedSpan takes its arguments when it
// starts; this one adds to them before it ends. A skipped batch's step has none.
class StepSpan {
 public:
  explicit StepSpan(int step) : on_(obs::timeline().on()), step_(step), t0_(on_ ? obs::trace_clock() : 0) {}
  ~StepSpan() {
    if (!on_) return;
    nlohmann::json args = {{"step", step_}};
    if (compute_s_ >= 0) args["compute_s"] = compute_s_;
    obs::timeline().add(obs::Span{fmt::format("step {}", step_), "step", "main", t0_, obs::trace_clock(), args});
  }
  StepSpan(const StepSpan&) = delete;
  StepSpan& operator=(const StepSpan&) = delete;
  void set_compute(double seconds) { compute_s_ = seconds; }

 private:
  bool on_;
  int step_;
  double t0_, compute_s_ = -1;
};

// What the loop needs besides the config: everything the builders made.
struct Job {
  const RunConfig& cfg;
  Topology& topo;
  ModelStack& stack;
  ForwardBackward& fb;
  Update& update;
  DataLoader& loader;
  TrainCheckpointer& ckpt;
  HostMirror* mirror;
  Observers& obs;
  RankGuard& guard;
  TraceWindow& trace;
  SdcCheck& sdc;
  TrainResult& res;
  SdcRerun rerun{cfg, topo, stack, fb, update};  // the Job's own (nothing else uses it), from the members above
};

// A stop is acted on only when every rank saw it, at the same step: a rank that stopped alone would leave the
// others waiting in the next step's collectives. One agreement over the host mesh per step (comm/agreement.h).
bool stop_agreed(Topology& topo) { return Agreement(topo.host_mesh.get()).any_rank(stop_requested()); }

// The checkpointer's events to the observers; a committed checkpoint is also on_checkpoint.
void checkpoint_events(Job& j) {
  for (const CheckpointEvent& e : j.ckpt.take_events()) {
    if (e.stage == CheckpointStage::Committed && j.topo.main_rank) j.res.last_checkpoint = e.dir;
    j.obs.each([&](TrainObserver& o) { o.on_checkpoint_event(e); });
    if (e.stage == CheckpointStage::Committed)
      j.obs.each([&](TrainObserver& o) { o.on_checkpoint(e.step, e.dir, kind_name(e.why)); });
  }
}

void sdc_check(Job& j, int step) {
  obs::ScopedSpan phase("phase", "sdc check");
  j.sdc.run(step);
  j.ckpt.set_replica_hash(j.sdc.agreed_step(), j.sdc.agreed_hash());
}

// The sigmoid_bias router's loads summed over the data-parallel ranks (exactly: int32 halves all-gathered over the
// host plane, then added), so every replica takes the same bias step; empty in a single process.
std::function<void(std::vector<int64_t>&)> sum_over_dp(Topology& topo) {
  if (!topo.host_mesh || topo.shape.dp == 1) return {};
  ProcessGroup* dp = &topo.host_mesh->dp();
  return [dp](std::vector<int64_t>& loads) {
    const size_t n = loads.size(), ranks = static_cast<size_t>(dp->size());
    std::vector<int32_t> mine(2 * n), all(2 * n * ranks);
    for (size_t e = 0; e < n; ++e) {
      mine[2 * e] = static_cast<int32_t>(loads[e] >> 31);
      mine[2 * e + 1] = static_cast<int32_t>(loads[e] & 0x7fffffff);
    }
    dp->all_gather(Tensor(all.data(), {static_cast<int64_t>(all.size())}, DType::I32, Device::CPU),
                   Tensor(mine.data(), {static_cast<int64_t>(mine.size())}, DType::I32, Device::CPU))
        ->wait();
    std::fill(loads.begin(), loads.end(), 0);
    for (size_t r = 0; r < ranks; ++r)
      for (size_t e = 0; e < n; ++e) loads[e] += (int64_t{all[r * 2 * n + 2 * e]} << 31) + all[r * 2 * n + 2 * e + 1];
  };
}

// Whether train_step saves a checkpoint (or a peer snapshot) after `step`.
bool saves_after(const Job& j, int step) {
  if (step == j.cfg.train.steps) return false;
  return (j.cfg.ckpt.every > 0 && step % j.cfg.ckpt.every == 0) || j.ckpt.snapshot_due(step);
}

// why: periodic (written in the background), final / stop (waited for), snapshot (a peer copy only).
// Every save first checks the replicas (a no-op when the step was checked already): a checkpoint is written only
// from parameters the data-parallel replicas agree on (train/sdc_check.h).
void checkpoint(Job& j, int step, SaveWhy why) {
  sdc_check(j, step);
  obs::ScopedSpan phase("phase", [why] {
    return obs::SpanInfo{fmt::format("checkpoint ({})", kind_name(why)), nullptr};
  });
  heartbeat_phase(Phase::Checkpoint);
  if (j.mirror) j.mirror->pull();
  with_kind(ErrorKind::IO, [&] { j.ckpt.snapshot(step, j.loader.state(), why); });
  checkpoint_events(j);
}

// One step: forward and backward, the optimizer, then the observers, evaluation and checkpoints. Returns false when
// the job agreed to stop after it.
bool train_step(Job& j, int step, double tokens_per_step, double flops_per_step, double peak) {
  const RunConfig& cfg = j.cfg;
  StepSpan span(step);
  const double t0 = now_seconds();
  if (j.guard.begin_step(step, j.loader, *j.stack.model)) return true;  // a skipped batch (train.skip_steps)
  j.stack.model->params().begin_grads();  // zeroed lazily: the first write overwrites (ParamStore)
  float loss;
  {
    obs::ScopedSpan phase("phase", "forward-backward");
    j.fb.set_step(step);
    loss = j.fb.run(j.loader, j.update);
  }
  // A MoE model's routing counts of this step's forwards, taken before a rerun (below) repeats them; every stage's.
  std::vector<MoeLayerStats> moe = gather_moe_stats(cfg.model, j.stack.model->take_moe_stats(),
                                                    j.topo.shape.pp > 1 ? &j.topo.host_mesh->pp() : nullptr);
  double norm;
  {
    obs::ScopedSpan phase("phase", "gradients");  // data-parallel reduction and the norm
    norm = j.update.finish_gradients(loss);
  }
  if (!std::isfinite(loss) || !std::isfinite(norm)) j.guard.fail_non_finite(step, loss, norm);
  j.rerun.after_gradients(step, loss, norm);  // a spike: the step again, before its update (train/sdc_rerun.h)
  j.stack.model->take_moe_stats();            // a rerun's counts repeat the step's: not reported twice
  const float scale = cfg.optim.grad_clip > 0 && norm > cfg.optim.grad_clip
                          ? static_cast<float>(cfg.optim.grad_clip / norm)
                          : 1.0f;
  const float lr = lr_at(cfg.optim, step, cfg.train.steps);
  heartbeat_phase(Phase::Optimizer);
  {
    obs::ScopedSpan phase("phase", "optimizer");
    j.update.step(lr, scale, step);
  }
  // sigmoid_bias router only: its balancing step, from this step's loads summed over the data-parallel ranks.
  j.stack.model->moe_update_bias(sum_over_dp(j.topo));
  j.guard.after_update(step, *j.stack.model, [&] { j.update.sync_params(); });
  // The replicas compare their parameters before the step reports: a corrupt step never reaches the metrics.
  // The last step is checked when the final save asks (checkpoint()), or by the interval.
  if (j.sdc.due(step) || saves_after(j, step)) sdc_check(j, step);
  const double dt = now_seconds() - t0;

  StepReport r;
  r.stats = StepStats{step, cfg.train.steps, loss, lr, norm, dt, tokens_per_step / dt, flops_per_step / dt, 0};
  r.stats.mfu = r.stats.model_flops_per_second / peak;
  r.dp = j.update.take_comm_time();
  r.dp += j.fb.take_dp_wait();
  r.tp = j.fb.take_tp_time();
  r.pp = j.fb.take_pp_time();
  if (j.stack.ep_comm) r.ep = j.stack.ep_comm->take_comm_time();
  r.memory_bytes = j.topo.ops->allocated_bytes();
  r.blend_epochs = j.loader.source_epochs(j.loader.state());
  r.straggler = j.fb.take_straggler_report();
  r.moe = std::move(moe);
  r.moe_loss = GPT::moe_loss(cfg.model, r.moe);
  j.obs.each([&](TrainObserver& o) { o.on_step(r); });
  span.set_compute(r.compute_seconds());
  if (step == j.res.first_step) j.res.first_loss = loss;
  j.res.last_loss = loss;
  j.res.last_step = step;

  if (cfg.train.eval_every > 0 && cfg.train.eval_batches > 0 &&
      (step % cfg.train.eval_every == 0 || step == cfg.train.steps)) {
    obs::ScopedSpan phase("phase", "eval");
    heartbeat_phase(Phase::Eval);
    std::vector<SourceLoss> by_source;
    j.res.last_val_loss = evaluate(*j.stack.model, cfg, j.topo, j.stack.microbatches, step, &by_source);
    if (!by_source.empty()) j.obs.each([&](TrainObserver& o) { o.on_eval_sources(step, by_source); });
    j.obs.each([&](TrainObserver& o) { o.on_eval(step, j.res.last_val_loss); });
  }
  if (cfg.ckpt.every > 0 && step % cfg.ckpt.every == 0 && step != cfg.train.steps)
    checkpoint(j, step, SaveWhy::Periodic);
  else if (j.ckpt.snapshot_due(step) && step != cfg.train.steps)
    checkpoint(j, step, SaveWhy::Snapshot);
  checkpoint_events(j);
  if (step < cfg.train.steps && stop_agreed(j.topo)) {
    j.res.stopped = true;
    if (j.topo.main_rank) fmt::print("stop requested: stopping after step {}\n", step);
    return false;
  }
  return true;
}

// The loop: steps start_step+1 .. train.steps. Returns the last completed step.
int train_loop(Job& j, int step, double peak) {
  const RunConfig& cfg = j.cfg;
  const double tokens_per_step = static_cast<double>(cfg.data.batch_size) * cfg.data.seq_len * cfg.train.grad_accum *
                                 j.topo.shape.dp * j.stack.microbatches;
  const double flops_per_step = cfg.model.flops_per_token(cfg.data.seq_len) * tokens_per_step;
  j.res.first_step = step + 1;
  while (step < cfg.train.steps) {
    ++step;
    j.trace.before_step(step);
    const bool go_on = train_step(j, step, tokens_per_step, flops_per_step, peak);
    j.trace.after_step(step);
    if (!go_on) break;
  }
  return step;
}

}  // namespace

TrainResult run_training(const RunConfig& cfg, const TrainSeams& seams, const std::vector<TrainObserver*>& extra) {
  RankGuard guard(cfg);  // heartbeats, injected faults, skipped batches, loss spikes (train/rank_guard.h)
  TrainResult res;
  Topology topo = build_topology(cfg, seams);
  if (topo.main_rank) prepare_output_dirs(cfg);

  // Its rows: read by its node's shared reader, or by a loader of its own (train/node_data.h).
  std::unique_ptr<DataLoader> own_loader = with_kind(ErrorKind::Data, [&] { return open_train_loader(cfg, topo); });
  DataLoader& loader = *own_loader;
  if (loader.vocab_size() > cfg.model.vocab_size)
    fail_as(ErrorKind::Data, "the shards in {} use a vocabulary of {} tokens but model.vocab_size is {}",
            data_dirs(cfg.data), loader.vocab_size(), cfg.model.vocab_size);
  ModelStack stack = build_model_stack(cfg, topo);
  if (cfg.train.eval_every > 0 && cfg.train.eval_batches > 0) check_val_split(cfg, topo, stack.microbatches);
  std::unique_ptr<Update> update = make_update(cfg, topo, stack);
  std::unique_ptr<ForwardBackward> fb = make_forward_backward(cfg, topo, stack);
  // A model in device memory is checkpointed (and imported) through a host copy, refreshed around each save.
  std::unique_ptr<HostMirror> mirror;
  if (topo.ops->device() != Device::CPU)
    mirror = std::make_unique<HostMirror>(*stack.model, update->optimizer(), cfg.optim, dp_pad_multiple(topo.shape.dp));
  // Checkpoints hold full tensors whatever the layout; the checkpointer gathers and scatters this rank's part over
  // the host mesh.
  TrainCheckpointer ckpt(cfg, mirror ? mirror->model() : *stack.model,
                         mirror ? mirror->optimizer() : update->optimizer(), update->data_parallel(),
                         topo.host_mesh.get(), stack.wte_copy, update->expert_data_parallel());
  ckpt.set_peer_links(make_peer_links(cfg, topo));
  ckpt.set_data_windows(loader.windows_per_epoch());
  if (cfg.ckpt.every > 0 || cfg.ckpt.save_final) ckpt.check_shared_dir();
  const StartPoint start = resume_or_init(cfg, *stack.model, ckpt, mirror.get(), loader, topo.main_rank);

  // Each rank's peak is its share of its node (train/peak.h): ranks on one CPU host share its cores.
  const PeakFlops peak = peak_flops(cfg.train.peak_tflops, *topo.ops,
                                    {omp_get_max_threads(), topo.rank_info.local_world_size, affinity_cpus()});
  const RunStart rs{&cfg,
                    start.step,
                    topo.rank_info.world_size,
                    topo.shape.dp,
                    topo.shape.pp,
                    topo.shape.tp,
                    omp_get_max_threads(),
                    cfg.model.num_params(),
                    loader.num_tokens(),
                    peak.flops * topo.rank_info.world_size,
                    peak.source,
                    topo.ops->device() == Device::CPU ? blas_core_summary() : "",
                    start.resumed_from,
                    topo.rank_info.rank,
                    topo.coord};
  MetricsLog metrics;
  ProgressPrinter progress(cfg.train.log_every);
  Observers obs;
  if (topo.main_rank) {
    metrics.open(cfg.train.out_dir + "/metrics.jsonl", start.step);
    obs.list = {&metrics, &progress};
  }
  obs.list.insert(obs.list.end(), extra.begin(), extra.end());
  obs.list.push_back(&guard);
  obs.list.push_back(ckpt.survivor());
  obs.each([&](TrainObserver& o) { o.on_run_start(rs); });

  TraceWindow trace(cfg, topo);
  SdcCheck sdc(cfg, topo, *stack.model, *update);
  update->set_before_reduce([&](size_t b, size_t e) { guard.before_reduce(*stack.model, b, e); });  // sdcgrad
  Job job{cfg, topo, stack, *fb, *update, loader, ckpt, mirror.get(), obs, guard, trace, sdc, res};
  int step = start.step;
  try {
    step = train_loop(job, step, rs.peak_flops);
    res.last_step = step;
    trace.finish();  // a window still open (the run stopped inside it) closes here
    // A stopped run saves when the config saves at all, so a restart resumes where it stopped.
    const bool save = res.stopped ? cfg.ckpt.save_final || cfg.ckpt.every > 0 : cfg.ckpt.save_final;
    if (save && step >= res.first_step) checkpoint(job, step, res.stopped ? SaveWhy::Stop : SaveWhy::Final);
    ckpt.wait();  // a periodic save still in flight completes (or fails) before the run ends
    checkpoint_events(job);
    update->sync_params();
    if (!res.stopped) {
      if (auto s = final_sample(cfg, *stack.model, topo)) {
        res.sample = s->text;
        obs.each([&](TrainObserver& o) { o.on_sample(step, s->text, s->tokens); });
      }
    }
  } catch (const Error& e) {
    obs.each([&](TrainObserver& o) { o.on_error(res.last_step, e.kind, e.what()); });
    // An abandoned attempt (core/stop_request.h) ends here, once the observers have written the snapshots and told
    // the supervisor: its groups' threads are still blocked in collectives with a peer that is gone, and unwinding
    // would join them, waiting out the group timeout.
    if (abandon_requested()) {
      fmt::print(stderr, "megatrain train: error: {}\nmegatrain train: exit code {} ({} error)\n", e.what(),
                 exit_code(e.kind), kind_name(e.kind));
      std::fflush(nullptr);
      std::_Exit(exit_code(e.kind));
    }
    throw;
  }
  return res;
}

}  // namespace mt
