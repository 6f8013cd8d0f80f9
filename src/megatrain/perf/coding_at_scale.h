// Gradient coding at LLM scale (`megatrain simulate --straggler-coding`): the straggler_coding model applied to a
// job laid out on several GPU counts. For each count the layout keeps tp and pp and takes dp = gpus / (tp pp)
// replicas, m = batch / (dp x micro-batch) micro-batch rounds per step; the healthy step H(L) comes from the step
// model (stragglers evicted, i.e. only the healthy GPUs' spread) at m and 2m micro-batches: H(L) = H(m) + (L - 1)
// (H(2m) - H(m)), so a coded replica that does L times the micro-batch work pays L times the part of the step that
// grows with the micro-batches, and the fixed part (bubble fill, optimizer, exposed gradient exchange) once.
// The straggler process defaults to MegaScale's persistent slow nodes (the cluster's [stragglers] node_fraction
// and slowdown, per replica of k nodes: rate 1 - (1 - f)^k); a rate, a burst duration and a slowdown may replace
// them. Each row gives every scheme's expected step, tokens/s, load and fallback probability, and the rates (at the
// process's duration and slowdown) and the slowdown (at its rate) above which each scheme beats none; a sweep over
// burst durations gives, for M-SGC and GC(1), the paying rates for transient stragglers and the least slowdown at
// which each pays at any rate, on the coded step's upper bound and with its waiting simulated (straggler_coding_sim).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "megatrain/perf/cluster.h"
#include "megatrain/perf/step_model.h"
#include "megatrain/perf/straggler_coding.h"
#include "megatrain/perf/straggler_coding_sim.h"

namespace mt::perf {

struct CodingOptions {
  std::vector<int> gpus = {1024, 2048, 4096, 8192, 12288};
  int global_batch = 6144;         // sequences per step (MegaScale Table 2's batch at 3,072 GPUs and more)
  std::optional<double> rate;      // per replica per round; default: MegaScale's node fraction per replica
  double duration = 0;             // mean burst, rounds; 0 = persistent
  std::optional<double> slowdown;  // default: the cluster's straggler_slowdown
  std::vector<double> sweep_durations = {1, 2, 4, 8, 16, 0};  // the transient sweep (0 = persistent)
  int simulated_steps = 1000;                                 // steps the Monte Carlo check simulates per point
};

struct SchemeRow {
  SchemeOutcome outcome;
  double tokens_per_second = 0;
  std::optional<RateInterval> paying_rates;  // at the process's duration and slowdown (none: empty)
  std::optional<double> paying_slowdown;     // at the process's rate and duration (none: empty)
  double simulated_step_seconds = 0;         // with the waiting simulated (straggler_coding_sim; none: the exact value)
};

struct CodingRow {
  int gpus = 0, dp = 0, microbatches = 0, replica_nodes = 0;
  double rate = 0;           // the process's per-replica rate at this layout
  double expected_slow = 0;  // n x rate: slow replicas in a round, on average
  HealthyStep healthy;
  double tokens_per_step = 0;
  std::vector<SchemeRow> schemes;  // none, GC(1), GC(2), SR-SGC, M-SGC (the SGC schemes with their best parameters)
  // For each sweep duration: the rates at which M-SGC / GC(1) beat none at the process's slowdown, and the least
  // slowdown at which each would at some rate.
  std::vector<std::optional<RateInterval>> sweep_msgc, sweep_gc1;
  std::vector<std::optional<SlowdownPoint>> sweep_msgc_slowdown, sweep_gc1_slowdown;
  // ... and, at that rate and with those parameters, the slowdown from which each pays when the coded step waits
  // what the Monte Carlo simulation (straggler_coding_sim) finds rather than the bound (nothing: never).
  std::vector<std::optional<double>> sweep_msgc_simulated, sweep_gc1_simulated;
};

struct CodingStudy {
  StragglerProcess process;  // rate: the first row's (the same for every row: replicas keep tp x pp)
  double node_fraction = 0;  // the cluster's, for the default rate
  bool megascale = true;     // the process is MegaScale's (no rate, duration or slowdown given)
  std::vector<double> sweep_durations;
  std::vector<CodingRow> rows;
  // Whether any coded scheme beats none at the process in any row: on its upper bound (then surely), or with its
  // waiting simulated.
  bool coding_pays() const;
  bool coding_pays_simulated() const;
};

// job: the model, techniques and layout (tp, pp, virtual stages, micro-batch, seq) to scale. Refuses a GPU count
// that tp x pp does not divide, or a batch that dp x micro-batch does not divide, naming --gpus / --batch.
CodingStudy coding_study(const Job& job, const Cluster& c, const CodingOptions& o);

}  // namespace mt::perf
