// Device memory per GPU for a 3D-parallel layout: weights, gradients and optimizer state (ZeRO: the optimizer
// state and fp32 master weights sharded over data parallel), and the activations the pipeline keeps alive (the
// peak number of micro-batch chunks in flight comes from the simulated schedule).
// Mixture of experts with expert parallelism: each MoE layer's routed experts are sharded over the ep ranks (their
// weights and gradients / ep), and their optimizer state ZeRO-sharded over the dp / ep ranks that hold the same
// experts (the expert-dp group), as the dense parameters' over dp; the router and the shared experts are dense
// parameters. Under tp the router, routed and shared experts are replicated (not / tp), their optimizer state still
// sharded over dp (routed: dp / ep) within each tp coordinate. A MoE layer keeps the activations of its rank's
// N x k / tp routed rows (moe_layer_activation_bytes).
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
  double experts = 0;      // of params + grads + optimizer, the routed experts' share (MoE; not added to total)
  double total() const { return params + grads + optimizer + activations; }
};

// The parameters of transformer layer `layer`: the dense ones (attention, norms, the MLP or the router and shared
// experts) and, on a MoE layer, the routed experts' (all of them, before any sharding). Without MoE every layer has
// the same count: the model's less the embedding, learned positions and an untied head, over the layers.
// replicated: the part of `dense` every tp rank holds whole (a MoE layer's router and shared experts; 0 on a dense
// layer, whose parameters this model takes as split over tp). The routed experts are replicated over tp too.
struct LayerParams {
  double dense = 0, experts = 0, replicated = 0;
  // Dense parameters on one GPU of a tp group.
  double dense_per_gpu(int tp) const { return (dense - replicated) / tp + replicated; }
};
LayerParams layer_params(const ModelConfig& m, int layer);

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
// The same for a MoE layer, on one GPU: Korthikanti's attention and norms (15sbh: the 34 less the MLP's 19), then what
// the MoE feed-forward keeps: its input (2NC bytes), the routed rows in expert order (2NkC), each expert's gate and
// up outputs and their product (3 x 2NkF), the experts' outputs for the gates' gradient (2NkC), the router's fp32
// scores (4NE), the shared experts' hidden activations (3 x 2NSF) and the dropout mask (NC). Full recomputation
// keeps the layer's input only (2sbh), as a dense layer. Under tp (sequence parallel) everything is per rank: the
// attention's share is split as in a dense layer, and the MoE runs on the rank's N / tp rows, so the whole / tp.
double moe_layer_activation_bytes(const ModelConfig& m, const Shape& s, const Techniques& t);
// The most loaded GPU (rank 0: the most micro-batches in flight, and the embedding).
// ep: expert-parallel ranks (1 without MoE); rank: the pipeline rank (a MoE model's ranks differ: dense first
// layers, the experts), with its own peak of chunks in flight.
MemoryBreakdown memory_per_gpu(const ModelConfig& m, const Shape& s, const Techniques& t, int dp, int pp, int v,
                               int peak_in_flight_chunks, const std::vector<int>& stage_layers = {}, int ep = 1,
                               int rank = 0);

}  // namespace mt::perf
