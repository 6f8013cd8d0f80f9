// The step-time model: a job (model, layout, techniques) on a cluster -> step seconds, MFU, tokens/s, a breakdown
// of where the time goes and memory per GPU. It builds per-stage costs from compute_cost, runs the real pipeline
// schedule in pipeline_sim, adds what happens outside the pipeline (reduce-scatter / all-gather when they are not
// overlapped, the optimizer step) and the expected straggler delay. The breakdown is found by simulating again
// without data-parallel traffic and without point-to-point time: each difference is what that traffic exposed.
// Mixture of experts (moe_cost.h): MoE layers cost what their routed and shared experts and all-to-alls cost, the
// other layers as dense ones; MFU counts the active parameters' FLOPs (ModelConfig::flops_per_token: the router,
// k routed and the shared experts per token). Expert parallelism (Layout::ep) takes ep of the dp ranks, adjacent
// after tp in the rank order (tp, ep, pp, dp / ep): an ep group spans tp x ep consecutive GPUs, pipeline neighbours
// are tp x ep apart. The dense parameters' gradients reduce over dp, the experts' over the dp / ep ranks holding
// the same experts.
#pragma once
#include <vector>
#include <string>

#include "megatrain/model/config.h"
#include "megatrain/perf/cluster.h"
#include "megatrain/perf/compute_cost.h"
#include "megatrain/perf/memory.h"

namespace mt::perf {

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int virtual_stages = 1;
  int microbatches = 1;  // per pipeline per step
  int micro_batch = 1;   // sequences per micro-batch
  int seq = 1024;
  std::vector<int> stage_layers;  // layers per virtual stage (parallel.stage_layers); empty = an even split
  int ep = 1;                     // expert-parallel ranks (MoE), carved out of dp: ep divides dp
  int gpus() const { return dp * pp * tp; }
  int global_batch() const { return dp * microbatches * micro_batch; }
};

struct Job {
  ModelConfig model;
  Layout layout;
  Techniques tech;
};

struct Breakdown {
  double compute = 0;       // kernels on the busiest pipeline rank
  double tp = 0;            // tensor-parallel collectives left on the critical path
  double ep = 0;            // expert-parallel all-to-alls (MoE) left on the critical path
  double pp = 0;            // point-to-point time the schedule could not hide
  double dp = 0;            // data-parallel reduce-scatter / all-gather (and tied-embedding all-reduce) exposed
  double bubble = 0;        // pipeline idle time with free communication
  double optimizer = 0;     // the optimizer step on the dp shard, and the global gradient-norm all-reduce
  double straggler = 0;     // expected wait for the slowest GPU, and for faulty slow nodes unless evicted
  double shared_cores = 0;  // CPU host with more ranks than cores: waiting for a core (0 on GPU clusters)
  double dp_sync = 0;  // the calibrated per-step cost that grows with dp (Cluster::dp_sync_seconds; 0 uncalibrated)
  double interference = 0;  // overlapped communication's cost to compute: overlap_interference x the busiest rank's
                            // hidden tp, pp and dp traffic (0 uncalibrated)
};

struct Prediction {
  double step_seconds = 0, mfu = 0, tokens_per_second = 0;
  double model_flops_per_step = 0;  // ModelConfig::flops_per_token x tokens (recomputation not counted; MoE: the
                                    // active parameters')
  Breakdown breakdown;
  MemoryBreakdown memory;
  int global_batch = 0;
  int peak_in_flight = 0;  // micro-batch chunks in flight on memory_rank
  int memory_rank = 0;     // the pipeline rank `memory` is for: 0 (the most in flight), or a MoE model's fullest
};

// Refuses an impossible job with an mt::Error (kind Config) naming the problem: dp*pp*tp != gpus (when gpus > 0),
// layers not divisible by pp * virtual_stages, heads not divisible by tp, micro-batches not a multiple of pp with
// virtual stages, a sequence longer than the model's, tp larger than a node on a rail-clos cluster is allowed
// (slow) but must divide the node when it spans several; parallel.ep not dividing dp or the experts, or above 1
// with a dense model.
void validate_job(const Job& job, const Cluster& c, int gpus = 0);
Prediction predict(const Job& job, const Cluster& c);
// The layers of each virtual stage that make the busiest stage's compute smallest: the first stage also computes
// the embedding, the last the final norm, LM head and loss, so they get fewer layers when those weigh enough. Every
// layer costs the same, so giving each layer in turn to the stage it makes least busy is optimal for this min-max
// (each stage keeps at least one). Returns the even split's counts when that is as good.
std::vector<int> balanced_stage_layers(const Job& job, const Cluster& c);
// The split to use: balanced_stage_layers(), then improved while moving one layer between neighbouring virtual stages
// shortens the simulated step (the schedule, not only the stages' compute, decides: in 1F1B the stages' positions
// matter). Never slower than the even split when there is one.
std::vector<int> best_stage_layers(const Job& job, const Cluster& c);

// Step seconds only (one simulation instead of three): for the layout search.
double predict_step_seconds(const Job& job, const Cluster& c, int* peak_in_flight = nullptr);

}  // namespace mt::perf
