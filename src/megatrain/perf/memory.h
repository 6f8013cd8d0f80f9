// Device memory per GPU for a 3D-parallel layout: weights, gradients and optimizer state (ZeRO: the optimizer
// state and fp32 master weights sharded over data parallel), and the activations the pipeline keeps alive (the
// peak number of micro-batch chunks in flight comes from the simulated schedule).
#pragma once
#include <vector>
#include "megatrain/model/config.h"
#include "megatrain/perf/compute_cost.h"

namespace mt::perf {

struct MemoryBreakdown {
  double params = 0;       // bf16 weights of this GPU's layers
  double grads = 0;        // fp32 gradient accumulation buffer (kept whole: micro-batches accumulate into it)
  double optimizer = 0;    // fp32 master weights + two moments, sharded over dp
  double activations = 0;  // kept for backward, for the in-flight micro-batches
  double total() const { return params + grads + optimizer + activations; }
};

// Parameters one GPU of pipeline stage `rank` holds (its layers / tp, plus the embedding or head rows on the end
// stages).
// stage_layers: layers per virtual stage (model/layout.h; empty = even), with v virtual stages per rank.
double params_per_gpu(const ModelConfig& m, int tp, int pp, int rank, int v = 1,
                      const std::vector<int>& stage_layers = {});
// Activation bytes one layer keeps per micro-batch under sequence parallelism (Korthikanti et al. 2022, §4: 34sbh/t
// when the attention core is not stored, 2sbh/t with full recomputation). Flash attention never stores the a*s*s
// scores, so "none" and "selective" keep the same bytes.
// the a*s*s score terms.
double layer_activation_bytes(const ModelConfig& m, const Shape& s, const Techniques& t);
// The most loaded GPU (rank 0: the most micro-batches in flight, and the embedding).
MemoryBreakdown memory_per_gpu(const ModelConfig& m, const Shape& s, const Techniques& t, int dp, int pp, int v,
                               int peak_in_flight_chunks, const std::vector<int>& stage_layers = {});

}  // namespace mt::perf
