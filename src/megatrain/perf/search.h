// `megatrain simulate --search`: every layout (tp, pp, dp, virtual stages, micro-batch size and so micro-batches,
// recomputation) that fits the model, the GPU count, the global batch and the memory limit, ranked by predicted
// step time. Layouts whose memory estimate exceeds the limit are dropped before they are simulated. For a MoE model
// the expert-parallel size is searched too (every ep dividing both dp and the expert count), against tp (which
// splits the attention but replicates the experts, each tp rank routing its own sequence-parallel rows).
#pragma once
#include <string>
#include <vector>

#include "megatrain/perf/step_model.h"

namespace mt::perf {

struct SearchOptions {
  int gpus = 0;
  int global_batch = 0;  // sequences per step
  int seq = 0;
  double memory_limit = 0;      // bytes per GPU; 0 = the cluster's memory
  double memory_reserve = 0.1;  // fraction of the limit kept free (allocator fragmentation, workspaces)
  Techniques tech;              // the switches to use (recompute is searched)
  std::vector<int> micro_batches = {1, 2, 4};
  int max_virtual_stages = 8;
  int keep = 8;  // how many ranked candidates to return
};

struct Candidate {
  Job job;
  double step_seconds = 0, mfu = 0, memory_bytes = 0;
};

struct SearchResult {
  std::vector<Candidate> ranked;  // best first
  int considered = 0, over_memory = 0, simulated = 0;
};

// Peak micro-batch chunks in flight on pipeline rank `rank` of the interleaved schedule (warm-up forwards + 1).
int peak_in_flight_estimate(int pp, int v, int microbatches, int rank = 0);
// The expert-parallel sizes the search tries with dp data-parallel ranks: 1, and for a MoE model every divisor of
// dp that divides model.moe_experts.
std::vector<int> expert_parallel_sizes(const ModelConfig& m, int dp);
SearchResult search_layouts(const ModelConfig& m, const Cluster& c, const SearchOptions& o);
// A few lines that say why the winner wins: its breakdown, and the best layout of each other (tp, pp) next to it.
std::string explain(const SearchResult& r, const Cluster& c);

}  // namespace mt::perf
