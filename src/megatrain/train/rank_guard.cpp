#include "megatrain/train/rank_guard.h"

#include <cmath>
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "megatrain/comm/env.h"
#include "megatrain/core/error.h"
#include "megatrain/model/gpt.h"

namespace mt {

namespace {

nlohmann::ordered_json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
}

}  // namespace

RankGuard::RankGuard(const RunConfig& cfg)
    : cfg_(cfg), skip_(cfg.train.skip_steps.begin(), cfg.train.skip_steps.end()),
      spikes_(SpikeRule{cfg.train.spike_window, cfg.train.spike_sigmas, cfg.train.spike_factor}) {
  try {
    rank_ = rank_info_from_env().rank;
  } catch (const Error&) {
    rank_ = -1;  // the topology builder reports the malformed variable; no fault can name this rank
  }
  main_rank_ = rank_ <= 0;
  const std::vector<Fault> faults = faults_from_env();
  const int attempt = attempt_from_env();
  if (auto hb = heartbeat_settings_from_env()) heartbeat_ = std::make_unique<Heartbeat>(*hb, rank_);
  faults_ = std::make_unique<FaultInjector>(faults, rank_, attempt);
}

RankGuard::~RankGuard() {
  if (heartbeat_ && !failed_ && std::uncaught_exceptions() == 0) heartbeat_->finished();
}

void RankGuard::on_run_start(const RunStart& rs) {
  rank_ = rs.rank;
  main_rank_ = rs.rank == 0;
  dp_ = rs.dp;
  faults_->check_world(rs.world_size);
  if (heartbeat_) {
    heartbeat_->set_coord(rs.coord);
    heartbeat_->set_layout(rs.dp, rs.pp, rs.tp, rs.cfg ? rs.cfg->train.grad_accum : 1, rs.start_step);
    heartbeat_->set_step(rs.start_step);
  }
}

bool RankGuard::begin_step(int step, DataLoader& loader, GPT& model) {
  heartbeat_phase(Phase::ForwardBackward);
  faults_->begin_step(step, model);
  if (!skip_.count(step)) return false;
  // The step's reads, as forward/backward would make them: train.grad_accum batches of data.batch_size x the
  // pipeline's micro-batches rows on each of the dp ranks (the global batch's positions in the window order).
  const uint64_t rows = static_cast<uint64_t>(cfg_.data.batch_size) * cfg_.pipeline_microbatches() * dp_;
  nlohmann::ordered_json batches = nlohmann::ordered_json::array();
  std::string where;
  for (int i = 0; i < cfg_.train.grad_accum; ++i) {
    const Batch b = with_kind(ErrorKind::Data, [&] { return loader.next(); });
    if (!b.taken.empty()) {  // a blend: the rows each source had given before the batch, and after it
      batches.push_back({{"blend_rows_before", b.taken}, {"blend_rows_after", b.next.taken}});
      where += fmt::format("{}blend rows per source [{}] to [{}]", where.empty() ? "" : "; ", fmt::join(b.taken, ", "),
                           fmt::join(b.next.taken, ", "));
      continue;
    }
    batches.push_back({{"epoch", b.epoch}, {"first", b.cursor}, {"last", b.cursor + rows - 1}});
    where += fmt::format("{}epoch {}, positions {}-{}", where.empty() ? "" : "; ", b.epoch, b.cursor,
                         b.cursor + rows - 1);
  }
  if (main_rank_) {
    fmt::print("skipping the batch of step {} (data rows: {}{}; train.skip_steps)\n", step, where,
               loader.blended() ? "" : " of the epoch's window order");
    std::fflush(stdout);
  }
  heartbeat_event("batch_skipped", {{"step", step}, {"batches", batches}});
  if (heartbeat_) heartbeat_->set_step(step);
  return true;
}

void RankGuard::after_update(int step, GPT& model, const std::function<void()>& settle) {
  faults_->after_update(step, model, settle);
}

void RankGuard::fail_non_finite(int step, float loss, double norm) {
  nlohmann::ordered_json what = nlohmann::ordered_json::array();
  if (!std::isfinite(loss)) what.push_back("loss");
  if (!std::isfinite(norm)) what.push_back("grad_norm");
  heartbeat_event("non_finite", {{"step", step},
                                 {"loss", finite_or_null(loss)},
                                 {"grad_norm", finite_or_null(norm)},
                                 {"non_finite", what}});
  fail_as(ErrorKind::NonFinite, "step {}: non-finite loss ({}) or gradient norm ({})", step, loss, norm);
}

void RankGuard::on_step(const StepReport& r) {
  const double compute = r.compute_seconds();
  faults_->step_compute(compute);
  if (heartbeat_)
    heartbeat_->step_done(r.stats.step, r.stats.loss, r.stats.step_seconds, compute, r.stats.tokens_per_second,
                          r.stats.mfu);
  if (heartbeat_ && main_rank_ && !r.moe.empty()) {  // the routing load metrics.jsonl logs, for the dashboard
    std::vector<obs::MoeLayerLoad> load;
    for (const MoeLayerStats& m : r.moe) load.push_back({m.layer, m.dropped, m.tokens});
    heartbeat_->moe_load(r.stats.step, load);
  }
  if (auto s = spikes_.observe(r.stats.loss)) {
    heartbeat_event("loss_spike", {{"step", r.stats.step},
                                   {"loss", r.stats.loss},
                                   {"rule", s->rule},
                                   {"threshold", s->threshold},
                                   {"mean", s->mean},
                                   {"std", s->std},
                                   {"median", s->median},
                                   {"window", s->samples}});
    if (main_rank_) {
      std::fflush(stdout);
      std::fprintf(stderr,
                   "warning: loss spike at step %d: %.6g > %s %.6g (mean %.6g, std %.6g, median %.6g of the last %d "
                   "steps; train.spike_*)\n",
                   r.stats.step, r.stats.loss,
                   s->rule == "sigma" ? "mean + spike_sigmas x std =" : "spike_factor x median =", s->threshold,
                   s->mean, s->std, s->median, s->samples);
      std::fflush(stderr);
    }
  }
}

void RankGuard::on_error(int step, ErrorKind kind, const std::string& what) {
  failed_ = true;
  // Written before returning: an abandoned attempt's rank leaves with _Exit right after (trainer.cpp).
  heartbeat_event("error", {{"step", step}, {"kind", kind_name(kind)}, {"code", exit_code(kind)}, {"message", what}},
                  /*sync=*/true);
}

}  // namespace mt
