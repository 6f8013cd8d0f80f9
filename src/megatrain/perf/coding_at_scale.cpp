#include "megatrain/perf/coding_at_scale.h"

#include <cmath>

#include "megatrain/core/error.h"

namespace mt::perf {

namespace {

// The job on `gpus` GPUs: dp = gpus / (tp pp), m = batch / (dp x micro-batch); stragglers evicted (the healthy
// step: only the healthy GPUs' spread is left in it).
Job scaled_job(const Job& job, int gpus, int batch) {
  Job j = job;
  Layout& L = j.layout;
  const int replica = L.tp * L.pp;
  if (gpus % replica != 0)
    fail_as(ErrorKind::Config, "--gpus {} is not a multiple of tp x pp = {} x {} (one replica)", gpus, L.tp, L.pp);
  L.dp = gpus / replica;
  const int per = L.dp * L.micro_batch;
  if (batch % per != 0)
    fail_as(ErrorKind::Config,
            "--batch {} is not a multiple of dp x data.batch_size = {} x {} at {} GPUs (each replica needs whole "
            "micro-batches)",
            batch, L.dp, L.micro_batch, gpus);
  L.microbatches = batch / per;
  j.tech.misc = true;
  return j;
}

HealthyStep healthy_step(const Job& j, const Cluster& c) {
  Job twice = j;
  twice.layout.microbatches *= 2;
  const double h1 = predict_step_seconds(j, c), h2 = predict_step_seconds(twice, c);
  return {2 * h1 - h2, h2 - h1};
}

SchemeRow scheme_row(CodingScheme s, const CodingParams& gc, const StragglerProcess& p, const CodingRow& row,
                     std::optional<SchemeOutcome> o, int steps) {
  SchemeRow r;
  r.outcome = *o;
  r.tokens_per_second = row.tokens_per_step / o->step_seconds;
  r.simulated_step_seconds = o->step_seconds;
  if (s != CodingScheme::None) {
    const double waited = simulate_waited_share(s, o->params, p, row.dp, row.microbatches, steps).mean;
    r.simulated_step_seconds = row.healthy.at(o->load) * (1 + p.slowdown * waited);
    r.paying_rates = paying_rates(s, gc, p, row.dp, row.microbatches, row.healthy);
    r.paying_slowdown = paying_slowdown(s, gc, p, row.dp, row.microbatches, row.healthy);
  }
  return r;
}

// At the rate and with the parameters of x (a least paying slowdown on the upper bound), the slowdown from which
// the scheme pays when the coded step waits what the simulation finds.
std::optional<double> simulated_slowdown(CodingScheme s, const std::optional<SlowdownPoint>& x, StragglerProcess p,
                                         const CodingRow& row, int steps) {
  if (!x) return std::nullopt;
  p.rate = x->rate;
  const int n = row.dp, m = row.microbatches;
  const double waited = simulate_waited_share(s, x->params, p, n, m, steps).mean;
  const double h1 = row.healthy.at(1), hl = row.healthy.at(x->load);
  const double denom = h1 * expected_max_slow_rounds(p, n, m) / m - hl * waited;
  if (denom <= 0) return std::nullopt;
  return std::max(0.0, (hl - h1) / denom);
}

CodingRow coding_row(const Job& job, const Cluster& c, const CodingOptions& o, int gpus, StragglerProcess p) {
  const Job j = scaled_job(job, gpus, o.global_batch);
  CodingRow row;
  row.gpus = gpus;
  row.dp = j.layout.dp;
  row.microbatches = j.layout.microbatches;
  row.replica_nodes = (j.layout.tp * j.layout.pp + c.node_gpus() - 1) / c.node_gpus();
  row.rate = p.rate;
  row.expected_slow = row.dp * p.rate;
  row.healthy = healthy_step(j, c);
  row.tokens_per_step = double(o.global_batch) * j.layout.seq;
  const int n = row.dp, m = row.microbatches;
  const CodingParams none, gc1{1}, gc2{2};
  const int steps = o.simulated_steps;
  row.schemes.push_back(scheme_row(CodingScheme::None, none, p, row,
                                   evaluate_scheme(CodingScheme::None, none, p, n, m, row.healthy), steps));
  for (const CodingParams& gc : {gc1, gc2})
    if (gc.s < n)
      row.schemes.push_back(scheme_row(CodingScheme::GC, gc, p, row,
                                       evaluate_scheme(CodingScheme::GC, gc, p, n, m, row.healthy), steps));
  for (CodingScheme s : {CodingScheme::SRSGC, CodingScheme::MSGC})
    if (std::optional<SchemeOutcome> best = best_sgc(s, p, n, m, row.healthy))
      row.schemes.push_back(scheme_row(s, none, p, row, best, steps));
  for (double d : o.sweep_durations) {
    StragglerProcess x = p;
    x.duration = d;
    x.rate = std::min(x.rate, x.max_rate());
    row.sweep_msgc.push_back(paying_rates(CodingScheme::MSGC, none, x, n, m, row.healthy));
    row.sweep_gc1.push_back(n > 1 ? paying_rates(CodingScheme::GC, gc1, x, n, m, row.healthy) : std::nullopt);
    row.sweep_msgc_slowdown.push_back(least_paying_slowdown(CodingScheme::MSGC, none, x, n, m, row.healthy));
    row.sweep_gc1_slowdown.push_back(n > 1 ? least_paying_slowdown(CodingScheme::GC, gc1, x, n, m, row.healthy)
                                           : std::nullopt);
    row.sweep_msgc_simulated.push_back(simulated_slowdown(CodingScheme::MSGC, row.sweep_msgc_slowdown.back(), x, row,
                                                          o.simulated_steps));
    row.sweep_gc1_simulated.push_back(simulated_slowdown(CodingScheme::GC, row.sweep_gc1_slowdown.back(), x, row,
                                                         o.simulated_steps));
  }
  return row;
}

}  // namespace

bool CodingStudy::coding_pays() const {
  for (const CodingRow& r : rows)
    for (const SchemeRow& s : r.schemes)
      if (s.outcome.scheme != CodingScheme::None && s.outcome.step_seconds < r.schemes[0].outcome.step_seconds)
        return true;
  return false;
}

bool CodingStudy::coding_pays_simulated() const {
  for (const CodingRow& r : rows)
    for (const SchemeRow& s : r.schemes)
      if (s.outcome.scheme != CodingScheme::None && s.simulated_step_seconds < r.schemes[0].outcome.step_seconds)
        return true;
  return false;
}

CodingStudy coding_study(const Job& job, const Cluster& c, const CodingOptions& o) {
  if (o.gpus.empty()) fail_as(ErrorKind::Config, "--straggler-coding needs at least one GPU count");
  CodingStudy study;
  study.node_fraction = c.straggler_node_fraction.value;
  study.megascale = !o.rate && o.duration == 0 && !o.slowdown;
  study.sweep_durations = o.sweep_durations;
  const Layout& L = job.layout;
  const int replica_nodes = (L.tp * L.pp + c.node_gpus() - 1) / c.node_gpus();
  StragglerProcess p;
  p.rate = o.rate ? *o.rate : replica_rate(study.node_fraction, replica_nodes);
  p.duration = o.duration;
  p.slowdown = o.slowdown ? *o.slowdown : c.straggler_slowdown.value;
  validate_process(p);
  study.process = p;
  for (int g : o.gpus) study.rows.push_back(coding_row(job, c, o, g, p));
  return study;
}

}  // namespace mt::perf
